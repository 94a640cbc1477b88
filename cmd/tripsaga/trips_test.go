package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/reconciler"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// TestTripsCommands drives `tripsaga trips list` and `trips bulk`
// against a real reconciler's API: the list's filters as flags, the bulk
// action's dry run (nothing recorded), its run on the confirmed count
// (another count refused), bulk-show and bulk-cancel.
func TestTripsCommands(t *testing.T) {
	ctx := context.Background()
	pool, _ := testenv.SchemaPool(t, reconciler.Schema, tripsql.SetSaga, tripsql.SetReconciler)
	_, _, js := testenv.JetStream(t)
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	r, err := reconciler.New(reconciler.Config{Pool: pool, JetStream: js, Interval: time.Hour, Companies: map[string]*provider.Client{
		"hotel": provider.Hotel("http://127.0.0.1:9/hotel"), "payment": provider.Payments("http://127.0.0.1:9/payments"), "car": provider.Cars("http://127.0.0.1:9/cars"),
	}})
	require.NoError(t, err)
	op, err := reconciler.NewOperator(reconciler.OperatorConfig{Reconciler: r, Token: "tok-1"})
	require.NoError(t, err)
	mux := http.NewServeMux()
	r.Register(mux)
	op.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = op.Run(rctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	t.Setenv("RECONCILER_URL", srv.URL)
	t.Setenv("OPERATOR_TOKEN", "tok-1")

	for i, trip := range []string{"T-cli-1", "T-cli-2", "T-cli-3"} {
		_, err := pool.Exec(ctx, `INSERT INTO trip_view (trip_id, seen, status, requested, events, first_event_at, last_event_at)
			VALUES ($1, '{trip.requested}', 'canceling', true, 1, now() - $2 * interval '1 minute', now())`, trip, 10-i)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO open_steps (trip_id, service, step, state, attempts, last_error, since, read_at) VALUES
		('T-cli-1', 'payment', 'payment', 'compensating', 4, 'refund: 503', now(), now()),
		('T-cli-2', 'payment', 'payment', 'compensating', 1, 'refund: 503', now(), now()),
		('T-cli-3', 'hotel', 'hotel', 'unknown', 2, 'timeout', now(), now())`)
	require.NoError(t, err)

	out, err := runCmd(t, tripsCmd(), "list", "--state", "compensating", "--company", "payment", "--order", "oldest", "--json")
	require.NoError(t, err, out)
	var page struct {
		Count int                       `json:"count"`
		Items []reconciler.TripListItem `json:"items"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	require.Equal(t, 2, page.Count)
	require.Equal(t, "T-cli-1", page.Items[0].TripID)
	require.Equal(t, 4, page.Items[0].OpenStep.Attempts)
	out, err = runCmd(t, tripsCmd(), "list", "--min-attempts", "2")
	require.NoError(t, err, out)
	require.Contains(t, out, "T-cli-3")
	require.Contains(t, out, "2 of 2 trips matching")
	_, err = runCmd(t, tripsCmd(), "list", "--state", "asleep")
	require.ErrorContains(t, err, "state: one of")

	out, err = runCmd(t, tripsCmd(), "bulk", "pause", "--company", "payment")
	require.NoError(t, err, out)
	require.Contains(t, out, "dry run: 2 trips match")
	require.Contains(t, out, "--yes 2")
	_, err = runCmd(t, tripsCmd(), "bulk", "pause", "--company", "payment", "--yes", "3", "--reason", "hold")
	require.ErrorContains(t, err, "matches 2 trips now, not the 3 confirmed")
	out, err = runCmd(t, tripsCmd(), "bulk", "pause", "--company", "payment", "--yes", "2", "--reason", "hold", "--rate", "0.1", "--follow=false")
	require.NoError(t, err, out)
	id := regexp.MustCompile(`B-[0-9A-Z]+`).FindString(out)
	require.NotEmpty(t, id, out)
	out, err = runCmd(t, tripsCmd(), "bulk-show", id)
	require.NoError(t, err, out)
	require.Contains(t, out, "pause of 2 trips matching company=payment")
	out, err = runCmd(t, tripsCmd(), "bulk-cancel", id, "--reason", "wrong one")
	require.NoError(t, err, out)
	require.Contains(t, out, "canceled: canceled by")
}
