package saga

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// TestAJobThatWaitedPastItsLease: a claimed call that waited for a call
// slot until its lease ran short renews the lease and calls when the row
// is still as claimed, and does not call at all when another process took
// the row meanwhile: never two calls of one key in flight.
func TestAJobThatWaitedPastItsLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.SchemaPool(t, "hotel", tripsql.SetSaga)
	var calls atomic.Int32
	company := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"hold_id":"H-1","key":"` + r.Header.Get("Idempotency-Key") + `","status":"held"}`))
	}))
	defer company.Close()
	c := provider.Hotel(company.URL)
	r, err := New(Config{Pool: pool, Timing: Timing{CallTimeout: 200 * time.Millisecond, StepDeadline: time.Hour}, Spec: Spec{
		Name: "hotel", Service: "hotel", Class: events.Compensable, Company: c, ActiveStatus: c.ActiveStatus,
		OnDone: events.HotelHeld, OnRejected: events.HotelRejected, OnFailed: events.HotelFailed, OnUndone: events.HotelReleased,
	}})
	require.NoError(t, err)
	insert := func(trip string) dbsqlc.Step {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		row, err := queries.StepInsertStarted(ctx, tx, dbsqlc.StepInsertStartedParams{
			TripID: trip, Step: "hotel", IdempotencyKey: trip + ":hotel", Request: []byte(`{}`), Fingerprint: "x", Trip: []byte(`null`),
			DeadlineMs: ms(time.Hour), LeaseMs: 100, // most of it spent waiting
		})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		return row
	}

	// Still as claimed: the lease is renewed and the call made.
	row := insert("T-still")
	r.forward(ctx, row)
	require.EqualValues(t, 1, calls.Load())
	got, err := queries.StepGetByTripAndName(ctx, pool, dbsqlc.StepGetByTripAndNameParams{TripID: "T-still", Step: "hotel"})
	require.NoError(t, err)
	require.Equal(t, "done", got.Status)

	// Taken meanwhile by another process (its claim wrote attempts 2 and
	// a new lease): no call.
	row = insert("T-taken")
	_, err = pool.Exec(ctx, "UPDATE steps SET attempts = 2, next_attempt_at = now() + interval '1 minute' WHERE trip_id = 'T-taken'")
	require.NoError(t, err)
	r.forward(ctx, row)
	require.EqualValues(t, 1, calls.Load(), "the company is not called a second time")
	got, err = queries.StepGetByTripAndName(ctx, pool, dbsqlc.StepGetByTripAndNameParams{TripID: "T-taken", Step: "hotel"})
	require.NoError(t, err)
	require.Equal(t, "started", got.Status)
	require.EqualValues(t, 2, got.Attempts, "the other process's claim is left as it is")
}
