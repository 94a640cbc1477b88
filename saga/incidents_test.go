package saga_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/saga"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// Issue 19 item 10: an incident gives the calls its step has made by now,
// not only the count when it was raised: an undo's incident its undo's
// calls, a forward step's its forward calls.
func TestIncidentsGiveTheCallsMadeNow(t *testing.T) {
	ctx := context.Background()
	pool, _ := testenv.SchemaPool(t, "svc", tripsql.SetSaga)
	_, err := pool.Exec(ctx, `
		INSERT INTO steps (trip_id, step, idempotency_key, request, fingerprint, trip, status, attempts, undo_attempts, deadline_at)
		VALUES ('T-inc-1', 'payment', 'T-inc-1:charge', '{}', 'f', '{}', 'compensating', 1, 9, now()),
		       ('T-inc-2', 'mail', 'T-inc-2:mail', '{}', 'f', '{}', 'unknown', 12, 0, now());
		INSERT INTO incidents (trip_id, step, kind, attempts, last_error) VALUES
		       ('T-inc-1', 'payment', 'compensation_stuck', 5, '503'),
		       ('T-inc-2', 'mail', 'forward_stuck', 10, 'timeout'),
		       ('T-inc-3', 'car', 'forward_stuck', 4, 'no step row')`)
	require.NoError(t, err)
	incs, err := saga.Incidents(ctx, pool)
	require.NoError(t, err)
	got := map[string][3]int{}
	for _, in := range incs {
		got[in.TripID] = [3]int{in.Attempts, in.AttemptsNow, in.Calls()}
	}
	require.Equal(t, map[string][3]int{
		"T-inc-1": {5, 9, 9},    // the undo's calls
		"T-inc-2": {10, 12, 12}, // the forward calls
		"T-inc-3": {4, 4, 4},    // no step row: as raised
	}, got)
}
