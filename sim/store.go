package sim

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tripsaga/tripsaga/sim/internal/dbsqlc"
)

// errNotFound is returned by a store's reads for a key it does not hold.
var errNotFound = errors.New("sim: not found")

// store keeps one company's records: the first answer to each
// Idempotency-Key, the records (holds, charges, bookings, messages) and the
// card statement lines. pgStore keeps them in the company's PostgreSQL
// schema; memStore in memory (lost when the process exits).
type store interface {
	// create claims claim.Key and runs fn in one transaction, storing the
	// answer fn returns. A key already stored (or claimed concurrently and
	// then committed) is not run again: create returns its stored row with
	// found true.
	create(ctx context.Context, claim dbsqlc.IdempotencyClaimParams, fn func(w storeTx) (answer, error)) (stored dbsqlc.Idempotency, found bool, a answer, err error)
	// undo runs fn in one transaction with the record of key locked, or
	// with rec nil when there is none; fn's writes are kept only when it
	// returns no error.
	undo(ctx context.Context, key string, fn func(rec *dbsqlc.Record, w storeTx) (answer, error)) (answer, error)
	// idempotency, record: errNotFound for an unknown key.
	idempotency(ctx context.Context, key string) (dbsqlc.Idempotency, error)
	record(ctx context.Context, key string) (dbsqlc.Record, error)
	list(ctx context.Context, p dbsqlc.RecordListParams) ([]dbsqlc.Record, error)
	statement(ctx context.Context, cardToken string) ([]dbsqlc.StatementLine, error)
	ping(ctx context.Context) error
	close()
}

// storeTx is the write side of one store transaction.
type storeTx interface {
	insertRecord(ctx context.Context, p dbsqlc.RecordInsertParams) (dbsqlc.Record, error)
	setStatus(ctx context.Context, p dbsqlc.RecordSetStatusParams) (dbsqlc.Record, error)
	insertStatementLine(ctx context.Context, p dbsqlc.StatementLineInsertParams) error
}

// pgStore is a company's schema; pool has search_path set to it.
type pgStore struct {
	pool *pgxpool.Pool
	q    *dbsqlc.Queries
}

type pgTx struct {
	tx pgx.Tx
	q  *dbsqlc.Queries
}

func (t pgTx) insertRecord(ctx context.Context, p dbsqlc.RecordInsertParams) (dbsqlc.Record, error) {
	return t.q.RecordInsert(ctx, t.tx, p)
}

func (t pgTx) setStatus(ctx context.Context, p dbsqlc.RecordSetStatusParams) (dbsqlc.Record, error) {
	return t.q.RecordSetStatus(ctx, t.tx, p)
}

func (t pgTx) insertStatementLine(ctx context.Context, p dbsqlc.StatementLineInsertParams) error {
	_, err := t.q.StatementLineInsert(ctx, t.tx, p)
	return err
}

func (s *pgStore) create(ctx context.Context, claim dbsqlc.IdempotencyClaimParams, fn func(w storeTx) (answer, error)) (dbsqlc.Idempotency, bool, answer, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return dbsqlc.Idempotency{}, false, answer{}, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = s.q.IdempotencyClaim(ctx, tx, claim)
	if errors.Is(err, pgx.ErrNoRows) {
		// Stored by an earlier (or concurrent, now committed) request.
		_ = tx.Rollback(ctx)
		stored, err := s.q.IdempotencyGet(ctx, s.pool, claim.Key)
		if err != nil {
			return dbsqlc.Idempotency{}, false, answer{}, fmt.Errorf("read stored answer: %w", err)
		}
		return stored, true, answer{}, nil
	}
	if err != nil {
		return dbsqlc.Idempotency{}, false, answer{}, fmt.Errorf("claim key: %w", err)
	}
	a, err := fn(pgTx{tx: tx, q: s.q})
	if err != nil {
		return dbsqlc.Idempotency{}, false, answer{}, err
	}
	if err := s.q.IdempotencySetAnswer(ctx, tx, dbsqlc.IdempotencySetAnswerParams{
		Key: claim.Key, StatusCode: int32(a.status), Response: a.body,
	}); err != nil {
		return dbsqlc.Idempotency{}, false, answer{}, fmt.Errorf("store answer: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return dbsqlc.Idempotency{}, false, answer{}, fmt.Errorf("commit: %w", err)
	}
	return dbsqlc.Idempotency{}, false, a, nil
}

func (s *pgStore) undo(ctx context.Context, key string, fn func(rec *dbsqlc.Record, w storeTx) (answer, error)) (answer, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return answer{}, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var recp *dbsqlc.Record
	rec, err := s.q.RecordGetByKeyForUpdate(ctx, tx, key)
	switch {
	case err == nil:
		recp = &rec
	case !errors.Is(err, pgx.ErrNoRows):
		return answer{}, fmt.Errorf("read record: %w", err)
	}
	a, err := fn(recp, pgTx{tx: tx, q: s.q})
	if err != nil {
		return answer{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return answer{}, fmt.Errorf("commit: %w", err)
	}
	return a, nil
}

func notFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return errNotFound
	}
	return err
}

func (s *pgStore) idempotency(ctx context.Context, key string) (dbsqlc.Idempotency, error) {
	i, err := s.q.IdempotencyGet(ctx, s.pool, key)
	return i, notFound(err)
}

func (s *pgStore) record(ctx context.Context, key string) (dbsqlc.Record, error) {
	r, err := s.q.RecordGetByKey(ctx, s.pool, key)
	return r, notFound(err)
}

func (s *pgStore) list(ctx context.Context, p dbsqlc.RecordListParams) ([]dbsqlc.Record, error) {
	return s.q.RecordList(ctx, s.pool, p)
}

func (s *pgStore) statement(ctx context.Context, cardToken string) ([]dbsqlc.StatementLine, error) {
	return s.q.StatementLineListByCardToken(ctx, s.pool, cardToken)
}

func (s *pgStore) ping(ctx context.Context) error { return s.pool.Ping(ctx) }

func (s *pgStore) close() { s.pool.Close() }
