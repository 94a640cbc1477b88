package saga

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// One clock decides the step log: PostgreSQL's. Every lease, backoff,
// deadline and verification time a runner writes is the database's now()
// (the transaction's start, the time the claims compare with) plus a
// duration, and every decision that compares a stored time (a deadline
// passed, how long ago a step was undone) is made against that now(), so
// replicas on hosts whose clocks disagree with each other or with the
// database's still agree on every lease. Written as now() + an interval in
// SQL where the statement computes it (StepInsertStarted, StepRenewLease,
// StepPostpone...), or from the transaction's now() read by [Runner.dbNow]
// where the runner computes the row in Go. The process's own clock only
// times local waits (how long to sleep until the next row is due, which the
// database says as a duration: StepNextDue).

// dbClock estimates the database's clock between statements, for a
// runner's local decision whether what is left of a lease covers a call
// ([Runner.leaseCovers]): the offset of the database's clock_timestamp()
// from the process's clock read just before that statement was sent. The
// statement runs after that read, so the offset is overestimated by at most
// its round trip: a lease looks shorter than it is, never longer.
type dbClock struct {
	offset atomic.Int64 // ns the database is ahead; valid when known
	known  atomic.Bool
}

// estimate returns the database's clock now as best known, and whether it
// is known (a statement of this runner has read it).
func (c *dbClock) estimate() (time.Time, bool) {
	return time.Now().Add(time.Duration(c.offset.Load())), c.known.Load()
}

// dbNow returns the database's now() in tx (the transaction's start: the
// now() every statement of tx compares with), and records the database's
// clock for [dbClock.estimate].
func (r *Runner) dbNow(ctx context.Context, tx dbsqlc.DBTX) (time.Time, error) {
	before := time.Now()
	c, err := queries.DBClock(ctx, tx)
	if err != nil {
		return time.Time{}, fmt.Errorf("saga: the database's clock: %w", err)
	}
	r.clock.offset.Store(int64(c.At.Sub(before)))
	r.clock.known.Store(true)
	return c.TxNow, nil
}

// ms is d in milliseconds, as the queries take durations (now() +
// make_interval(secs => ms / 1000)).
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
