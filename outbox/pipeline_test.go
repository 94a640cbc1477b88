package outbox

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// countingConn counts the writes a connection makes: pgx writes a
// statement, or a whole pipeline, with one write, so the count is the
// round trips a transaction made.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestPipelinedUnitOfWork: a unit of work's BEGIN goes with its first
// statement and the statements given to Later with the next one or with
// the COMMIT, and the transaction means what it meant without the
// pipeline: all or nothing, in the order written, a failure reported by
// the call that sent it, the connection back in the pool after.
func TestPipelinedUnitOfWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE things (id text PRIMARY KEY)`)
	require.NoError(t, err)

	var writes atomic.Int64
	cfg := b.pool.Config()
	cfg.MaxConns = 1
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	uow := UnitOfWork{Pool: pool}
	count := func(query string, args ...any) int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, query, args...).Scan(&n))
		return n
	}

	t.Run("AStatementAndAnEventAreTwoRoundTrips", func(t *testing.T) {
		book := func(id string) error {
			return uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO things (id) VALUES ($1)`, id); err != nil {
					return err
				}
				return Write(ctx, tx, newEvent(t, id))
			})
		}
		require.NoError(t, book("T-rt-warm")) // the first one prepares its statements
		before := writes.Load()
		require.NoError(t, book("T-rt"))
		// BEGIN with the INSERT; the outbox row and its notify with the COMMIT.
		require.Equal(t, int64(2), writes.Load()-before, "round trips of BEGIN, INSERT, outbox INSERT, notify, COMMIT")
		require.Equal(t, 1, count(`SELECT count(*) FROM things WHERE id = 'T-rt'`))
		require.Equal(t, 2, count(`SELECT count(*) FROM outbox`))
	})

	t.Run("ALaterStatementRunsBeforeTheNextOne", func(t *testing.T) {
		var seen int
		err := uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := Later(tx).Exec(ctx, `INSERT INTO things (id) VALUES ('T-order')`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT count(*) FROM things WHERE id = 'T-order'`).Scan(&seen)
		})
		require.NoError(t, err)
		require.Equal(t, 1, seen, "the later INSERT went first, in the same transaction")
	})

	t.Run("AFailingLaterStatementRollsEverythingBackAndNamesItself", func(t *testing.T) {
		err := uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO things (id) VALUES ('T-fail-1')`); err != nil {
				return err
			}
			_, err := Later(tx).Exec(ctx, "-- name: ThingInsert :exec\nINSERT INTO things (id) VALUES ('T-fail-1')")
			return err
		})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23505", pgErr.Code, "the duplicate key of the later INSERT")
		require.ErrorContains(t, err, "commit: deferred ThingInsert:")
		require.Zero(t, count(`SELECT count(*) FROM things WHERE id = 'T-fail-1'`), "the first INSERT rolled back with it")
	})

	t.Run("AFailedStatementIsNeverCommitted", func(t *testing.T) {
		err := uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, _ = Later(tx).Exec(ctx, `INSERT INTO things (id) VALUES ('T-ignored')`)
			// This one fails before it is sent (it cannot be prepared), so
			// not even the pipeline's BEGIN ran; its error is ignored.
			_, _ = tx.Exec(ctx, `INSERT INTO nothing_here (id) VALUES ('x')`)
			_, err := tx.Exec(ctx, `INSERT INTO things (id) VALUES ('T-after-failure')`)
			require.ErrorIs(t, err, pgx.ErrTxCommitRollback, "refused, as PostgreSQL refuses statements after a failure")
			return nil
		})
		require.ErrorIs(t, err, pgx.ErrTxCommitRollback, "the COMMIT of a failed transaction")
		require.Zero(t, count(`SELECT count(*) FROM things WHERE id IN ('T-ignored', 'T-after-failure')`), "nothing ran outside the transaction")
	})

	t.Run("NoRowIsErrNoRowsAndRowsLeftOpenDoNotBlockTheNextStatement", func(t *testing.T) {
		err := uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			var id string
			require.ErrorIs(t, tx.QueryRow(ctx, `SELECT id FROM things WHERE id = 'none'`).Scan(&id), pgx.ErrNoRows)
			rows, err := Later(tx).Query(ctx, `SELECT id FROM things`)
			require.NoError(t, err)
			for rows.Next() { // read to the end, never closed
			}
			_, err = tx.Exec(ctx, `INSERT INTO things (id) VALUES ('T-after-rows')`)
			return err
		})
		require.NoError(t, err)
		require.Equal(t, 1, count(`SELECT count(*) FROM things WHERE id = 'T-after-rows'`))
	})

	t.Run("AnEmptyUnitOfWorkSendsNothing", func(t *testing.T) {
		before := writes.Load()
		require.NoError(t, uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return nil }))
		require.Equal(t, before, writes.Load())
	})

	// Every transaction above, failed or not, gave its connection back
	// (the pool holds one): this acquires it.
	require.Zero(t, pool.Stat().AcquiredConns())
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	require.Equal(t, byte('I'), c.Conn().PgConn().TxStatus(), "no transaction left open on it")
	c.Release()
}
