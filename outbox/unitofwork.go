package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Beginner begins a PostgreSQL transaction: a *pgxpool.Pool, a *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// UnitOfWork is the ceremony around one state change and the events it
// publishes, as a value: the transaction, the outbox rows written in it,
// their publish right after the COMMIT. Every transaction of a service
// that writes events goes through [UnitOfWork.InTx].
type UnitOfWork struct {
	// Pool begins the transactions. Required.
	Pool Beginner
	// Relay, when set and running, publishes the events written in the
	// transaction right after its COMMIT (see [WithAfterCommit]); nil: they
	// wait for a relay's claim.
	Relay *Relay
	// Committed, when set, is called after each COMMIT and before the
	// after-commit work; false drops that work, as a process that stopped
	// right after its commit would (the saga's fault point after_log,
	// package fault). The recovery paths are correct without that work.
	Committed func(ctx context.Context) bool
}

// InTx runs fn in one transaction: it begins it, gives fn a context in
// which [Write] hands its events to the relay and [AfterCommit] registers
// work for after the commit, commits when fn returns nil, and then runs
// that work (the relay's local publish first). When fn returns an error,
// or the COMMIT fails, the transaction is rolled back, nothing registered
// runs, and InTx returns fn's error unchanged (so a caller may return a
// sentinel of its own to roll back on purpose) or the COMMIT's wrapped
// as "commit: ...".
//
// On a pool (a *pgxpool.Pool) the transaction is pipelined (pipeline.go):
// its BEGIN goes with its first statement, and the statements given to
// [Later] with the next one or with the COMMIT.
func (u UnitOfWork) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	var tx pgx.Tx
	var err error
	if p, ok := u.Pool.(acquirer); ok {
		tx, err = beginPipelined(ctx, p)
	} else {
		tx, err = u.Pool.Begin(ctx)
	}
	if err != nil {
		return err
	}
	// A rollback after a commit is a no-op; after a cancel of ctx it must
	// still be sent, hence its own context.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	tctx, committed := WithAfterCommit(ctx, u.Relay)
	if err := fn(tctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(tctx); err != nil {
		// It may have committed all the same (the answer lost: pgx
		// #2110): whatever fn wrote must be safe to find again.
		return fmt.Errorf("commit: %w", err)
	}
	if u.Committed != nil && !u.Committed(tctx) {
		return nil
	}
	committed()
	return nil
}
