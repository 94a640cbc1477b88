package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A unit of work's transaction is pipelined (PostgreSQL's extended query
// protocol lets a client send several statements before reading their
// results, the "pipeline mode" of the PostgreSQL docs, chapter "libpq:
// Pipeline Mode"; pgx sends a [pgx.Batch] so, ending it with one Sync):
//
//   - its BEGIN is not a round trip of its own: it goes with the
//     transaction's first statement;
//   - a statement given to [Later] (an INSERT into the outbox, a
//     pg_notify, a lock whose result nobody reads) goes with the next
//     statement or with the COMMIT.
//
// Every statement still runs once, in the order the code gave them, in the
// one transaction: a transaction of a BEGIN, an inbox insert, a step
// insert, an outbox insert and a COMMIT costs three round trips instead of
// five. When a statement fails, PostgreSQL skips the rest of its pipeline
// up to the Sync (a COMMIT queued behind it is never executed) and the
// transaction is aborted, as it would be without the pipeline; the failure
// of a statement given to Later is reported by the call that sent it (the
// next statement's, or the Commit's), wrapped as "deferred <name>: ...".

// acquirer is a pool whose connections a unit of work holds for a
// pipelined transaction (a *pgxpool.Pool).
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// pipeTx is the pgx.Tx of a pipelined unit of work, on a connection held
// from the pool until Commit or Rollback.
type pipeTx struct {
	conn   *pgxpool.Conn
	begun  bool       // BEGIN sent
	closed bool       // committed or rolled back, conn released
	later  []queued   // statements given to Later, not sent yet
	open   *batchRows // rows of the last pipeline, still being read
	err    error      // the first statement that failed: the transaction is aborted
}

// queued is one statement given to [Later].
type queued struct {
	sql  string
	args []any
}

// beginPipelined acquires a connection of pool for a pipelined
// transaction; nothing is sent yet.
func beginPipelined(ctx context.Context, pool acquirer) (*pipeTx, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &pipeTx{conn: conn}, nil
}

// settle finishes reading the rows of the last pipeline, whose caller may
// have read them to the end without closing them.
func (t *pipeTx) settle() error {
	if t.open == nil {
		return nil
	}
	err := t.open.finish()
	t.open = nil
	return err
}

// send sends what is owed (BEGIN, the statements given to Later) and, when
// sql is not "", sql after them, in one pipeline. It returns the results
// positioned at sql's, or nil when sql is "".
func (t *pipeTx) send(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	if err := t.settle(); err != nil {
		return nil, err
	}
	if t.err != nil {
		return nil, t.failed()
	}
	b := &pgx.Batch{}
	begin := !t.begun
	if begin {
		b.Queue("begin")
	}
	later := t.later
	t.later = nil
	for _, q := range later {
		b.Queue(q.sql, q.args...)
	}
	if sql != "" {
		b.Queue(sql, args...)
	}
	if len(b.QueuedQueries) == 0 {
		return nil, errNothingOwed // flush sends nothing then
	}
	br := t.conn.Conn().SendBatch(ctx, b)
	t.begun = true // whatever came of it, Rollback must end what may be open
	if begin {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, t.fail(fmt.Errorf("begin: %w", err))
		}
	}
	for _, q := range later {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, t.fail(fmt.Errorf("deferred %s: %w", statementName(q.sql), err))
		}
	}
	if sql == "" {
		return nil, br.Close()
	}
	return br, nil
}

// fail records err as the transaction's failure and returns it. Any
// failure ends the transaction, as PostgreSQL's own rule for a statement
// that fails inside one (every later statement is refused until the
// ROLLBACK) would: here also when the failure was the client's (a pipeline
// that could not be prepared or encoded, so that not even its BEGIN ran),
// so that no statement after it runs outside the transaction and no
// COMMIT goes without the statements given to Later.
func (t *pipeTx) fail(err error) error {
	if t.err == nil && err != nil {
		t.err = err
	}
	return err
}

// failed is what every call after a failure returns.
func (t *pipeTx) failed() error {
	return fmt.Errorf("%w: an earlier statement failed: %w", pgx.ErrTxCommitRollback, t.err)
}

// statementName is the sqlc name of a query ("-- name: OutboxInsert
// :exec" gives OutboxInsert), or its first line.
func statementName(sql string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(sql), "\n")
	if name, ok := strings.CutPrefix(line, "-- name: "); ok {
		name, _, _ = strings.Cut(name, " ")
		return name
	}
	return line
}

// direct reports whether a statement can go on its own, as pgx sends it:
// nothing is owed before it.
func (t *pipeTx) direct() bool {
	return t.begun && len(t.later) == 0 && t.open == nil && !t.closed && t.err == nil
}

func (t *pipeTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.direct() {
		tag, err := t.conn.Exec(ctx, sql, args...)
		return tag, t.fail(err)
	}
	br, err := t.send(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, t.fail(err)
}

func (t *pipeTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.direct() {
		rows, err := t.conn.Query(ctx, sql, args...)
		if err != nil {
			return nil, t.fail(err)
		}
		t.open = &batchRows{Rows: rows, tx: t}
		return t.open, nil
	}
	br, err := t.send(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, t.fail(err)
	}
	t.open = &batchRows{Rows: rows, br: br, tx: t}
	return t.open, nil
}

func (t *pipeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return &pipeRow{rows: rows, err: err}
}

// Commit sends what is owed with the COMMIT, in one pipeline. A
// transaction that sent nothing has nothing to commit. A COMMIT that
// PostgreSQL answered ROLLBACK (the transaction had failed) is
// [pgx.ErrTxCommitRollback], as from pgx's own transactions.
func (t *pipeTx) Commit(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	if err := t.settle(); err != nil {
		t.rollback(context.WithoutCancel(ctx))
		return err
	}
	if t.err != nil {
		t.rollback(context.WithoutCancel(ctx))
		return t.failed()
	}
	if !t.begun && len(t.later) == 0 {
		t.release()
		return nil
	}
	br, err := t.send(ctx, "commit", nil)
	if err == nil {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err == nil && tag.String() == "ROLLBACK" {
			err = pgx.ErrTxCommitRollback
		}
	}
	if err != nil {
		t.rollback(context.WithoutCancel(ctx))
		return err
	}
	t.release()
	return nil
}

// Rollback ends the transaction if one was begun; after Commit it does
// nothing and returns pgx.ErrTxClosed, as pgx's own transactions do.
func (t *pipeTx) Rollback(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.rollback(ctx)
	return nil
}

// rollback sends ROLLBACK when a transaction may be open, and releases the
// connection (the pool closes one left in a transaction or busy).
func (t *pipeTx) rollback(ctx context.Context) {
	_ = t.settle()
	t.later = nil
	if t.begun && !t.conn.Conn().IsClosed() && t.conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = t.conn.Exec(ctx, "rollback")
	}
	t.release()
}

func (t *pipeTx) release() {
	t.closed = true
	t.conn.Release()
}

// flush sends what is owed, for the methods that hand the connection on.
func (t *pipeTx) flush(ctx context.Context) error {
	if t.begun && len(t.later) == 0 && !t.closed && t.err == nil {
		return t.settle()
	}
	_, err := t.send(ctx, "", nil)
	return err
}

// errNothingOwed: send was asked for no statement with nothing owed
// (flush does not ask then).
var errNothingOwed = errors.New("outbox: a pipeline with nothing to send")

// Begin would open a savepoint; a unit of work does not nest.
func (t *pipeTx) Begin(ctx context.Context) (pgx.Tx, error) {
	return nil, errors.New("outbox: a unit of work's transaction does not nest (no savepoints)")
}

func (t *pipeTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *pipeTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.flush(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects is not offered by a unit of work's transaction: pgx builds
// them only on its own transactions.
func (t *pipeTx) LargeObjects() pgx.LargeObjects {
	panic("outbox: a unit of work's transaction has no large objects")
}

func (t *pipeTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.conn.Conn().Prepare(ctx, name, sql)
}

// Conn is the connection the transaction runs on. Statements sent on it
// directly bypass the pipeline: the BEGIN and the statements given to
// Later may not have been sent yet.
func (t *pipeTx) Conn() *pgx.Conn { return t.conn.Conn() }

// batchRows are the rows of a pipeline's last statement; closing them
// reads the pipeline to its end.
type batchRows struct {
	pgx.Rows
	br   pgx.BatchResults // nil: rows of a statement sent on its own
	tx   *pipeTx
	err  error
	done bool
}

func (r *batchRows) finish() error {
	if r.done {
		return r.err
	}
	r.done = true
	r.Rows.Close()
	r.err = r.Rows.Err()
	if r.br != nil {
		if err := r.br.Close(); r.err == nil {
			r.err = err
		}
	}
	if r.tx.open == r {
		r.tx.open = nil
	}
	return r.tx.fail(r.err)
}

func (r *batchRows) Close() { _ = r.finish() }

func (r *batchRows) Err() error {
	if r.done {
		return r.err
	}
	return r.Rows.Err()
}

// pipeRow is QueryRow's row, read as pgx reads its own: no row is
// pgx.ErrNoRows.
type pipeRow struct {
	rows pgx.Rows
	err  error
}

func (r *pipeRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// DBTX is what the sqlc queries of every package take: a transaction, a
// pool, a connection, or [Later]'s.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Later returns db for a statement whose result nobody reads (an INSERT
// the code does not check, a pg_notify, an advisory lock): in a unit of
// work's transaction its Exec sends nothing yet and returns an empty
// command tag; the statement goes, in its place in the order, with the
// transaction's next statement or with its COMMIT, whose call reports its
// failure. Outside a unit of work (a pool, a plain pgx.Tx), and for Query
// and QueryRow, db is used as it is.
func Later(db DBTX) DBTX {
	if t, ok := db.(*pipeTx); ok {
		return laterTx{t}
	}
	return db
}

// laterTx is [Later]'s view of a pipelined transaction.
type laterTx struct{ *pipeTx }

func (l laterTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if l.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	l.later = append(l.later, queued{sql: sql, args: args})
	return pgconn.CommandTag{}, nil
}
