package trips

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/process"
)

// TestPreferWaitWakesAtAnyReplica: a traveler's POST with Prefer: wait is
// answered settled by replica A though replica B projected the events that
// settled the trip: B's commit notifies every replica (LISTEN/NOTIFY).
func TestPreferWaitWakesAtAnyReplica(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := schemaPool(t)
	_, nc, js := testenv.JetStream(t)
	a, err := New(Config{Pool: pool, JetStream: js, MailURL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	b, err := New(Config{Pool: pool, JetStream: js, MailURL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	go a.listenSettled(ctx)
	mux := http.NewServeMux()
	a.Handler(mux)
	hs := httptest.NewServer(process.Guard(nc, process.Problems(mux)))
	defer hs.Close()

	type posted struct {
		code int
		body map[string]any
		err  error
	}
	got := make(chan posted, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/trips", strings.NewReader(tripJSON(t, nil)))
		req.Header.Set("Prefer", "wait=60")
		req.Header.Set("Idempotency-Key", "replicas-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- posted{err: err}
			return
		}
		defer resp.Body.Close()
		var m map[string]any
		err = json.NewDecoder(resp.Body).Decode(&m)
		got <- posted{code: resp.StatusCode, body: m, err: err}
	}()
	var trip string
	testenv.Eventually(t, func() bool {
		return pool.QueryRow(ctx, "SELECT trip_id FROM trips WHERE idempotency_key = 'replicas-1'").Scan(&trip) == nil
	}, "the trip is recorded")

	// Replica B projects the step events; A's request is waiting.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	for _, typ := range []string{events.HotelHeld, events.PaymentCharged, events.CarBooked} {
		e, err := events.New("test", typ, trip, events.StepData{TripID: trip})
		require.NoError(t, err)
		require.NoError(t, b.project(ctx, tx, e))
	}
	require.NoError(t, tx.Commit(ctx))

	p := <-got
	require.NoError(t, p.err)
	require.Equal(t, http.StatusCreated, p.code, p.body)
	require.Equal(t, StatusConfirmed, p.body["status"], "answered settled by the replica that did not project it")
	testenv.Eventually(t, func() bool { return a.notified.Load() >= 1 }, "A heard B's notification")
}
