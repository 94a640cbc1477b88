package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/reconciler"
	"github.com/tripsaga/tripsaga/sim"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func runCmd(t *testing.T, cmd *cobra.Command, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// TestOperatorCommands drives the incidents, deadletter and repair
// commands against a real reconciler's API (its own PostgreSQL schema,
// embedded JetStream, the company simulators).
func TestOperatorCommands(t *testing.T) {
	ctx := context.Background()
	pool, url := testenv.SchemaPool(t, reconciler.Schema, tripsql.SetSaga, tripsql.SetReconciler)
	_, _, js := testenv.JetStream(t)
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	sims, err := sim.New(ctx, sim.Config{DatabaseURL: url})
	require.NoError(t, err)
	companies := httptest.NewServer(sims.Handler())
	t.Cleanup(func() { companies.Close(); sims.Close() })
	r, err := reconciler.New(reconciler.Config{Pool: pool, JetStream: js, Interval: time.Hour,
		Companies: map[string]*provider.Client{
			"hotel": provider.Hotel(companies.URL + "/hotel"), "payment": provider.Payments(companies.URL + "/payments"), "car": provider.Cars(companies.URL + "/cars"),
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

	t.Setenv("OPERATOR_TOKEN", "")
	_, err = runCmd(t, repairCmd(), "pause", "T-cli-1", "--service", "hotel", "--reason", "outage")
	require.ErrorContains(t, err, "OPERATOR_TOKEN is not set")
	t.Setenv("OPERATOR_TOKEN", "wrong")
	_, err = runCmd(t, repairCmd(), "pause", "T-cli-1", "--service", "hotel", "--reason", "outage")
	require.ErrorContains(t, err, "401")
	t.Setenv("OPERATOR_TOKEN", "tok-1")
	_, err = runCmd(t, repairCmd(), "pause", "T-cli-1", "--service", "hotel")
	require.ErrorContains(t, err, "--reason is required")
	_, err = runCmd(t, incidentsCmd(), "retry", "T-cli-1", "--reason", "r")
	require.ErrorContains(t, err, "--service is required")
	_, err = runCmd(t, repairCmd(), "pause", "T-cli-1", "--service", "mail", "--reason", "r")
	require.ErrorContains(t, err, `field "service"`)

	out, err := runCmd(t, repairCmd(), "pause", "T-cli-1", "--service", "hotel", "--reason", "card outage", "--operator", "ada", "--key", "K-1", "--json")
	require.NoError(t, err, out)
	var first event.Event
	require.NoError(t, json.Unmarshal([]byte(out), &first), out)
	var d events.OperatorActionData
	require.NoError(t, first.DataAs(&d))
	require.Equal(t, events.OperatorActionData{Action: "pause", TripID: "T-cli-1", Service: "hotel", Reason: "card outage", Operator: "ada", IdempotencyKey: "K-1"}, d)
	out, err = runCmd(t, repairCmd(), "pause", "T-cli-1", "--service", "hotel", "--reason", "card outage", "--operator", "ada", "--key", "K-1")
	require.NoError(t, err, out)
	require.Contains(t, out, first.ID(), "the same key is the same action")
	_, err = runCmd(t, repairCmd(), "resume", "T-cli-1", "--service", "hotel", "--reason", "over", "--key", "K-1")
	require.ErrorContains(t, err, "409")

	out, err = runCmd(t, incidentsCmd(), "resolve", "T-cli-1", "--service", "payment", "--incident", "compensation_stuck", "--reason", "refunded by hand", "--operator", "bo")
	require.NoError(t, err, out)
	require.Contains(t, out, "resolve of trip T-cli-1 asked of payment by bo (refunded by hand)")
	_, err = runCmd(t, incidentsCmd(), "settle", "T-cli-1", "--service", "payment", "--reason", "refunded by hand")
	require.ErrorContains(t, err, "--outcome is required: undone, done, not_done")
	_, err = runCmd(t, incidentsCmd(), "settle", "T-cli-1", "--service", "payment", "--outcome", "undone", "--reason", "refunded by hand")
	require.ErrorContains(t, err, "409", "no event of the trip shows its refund stuck")
	require.ErrorContains(t, err, "no undo of it is stuck")
	out, err = runCmd(t, incidentsCmd(), "settle", "T-cli-1", "--service", "payment", "--outcome", "done", "--reason", "the charge is in the statement", "--operator", "bo")
	require.NoError(t, err, out)
	require.Contains(t, out, "settle of trip T-cli-1 asked of payment by bo (the charge is in the statement)")
	_, err = runCmd(t, incidentsCmd(), "settle", "T-cli-1", "--service", "payment", "--outcome", "done", "--reason", "again")
	require.ErrorContains(t, err, "was settled already (done, by bo at ")
	out, err = runCmd(t, repairCmd(), "undo-leak", "T-cli-1", "--service", "hotel", "--reason", "r")
	require.ErrorContains(t, err, "no open orphan or half finding", out)

	out, err = runCmd(t, incidentsCmd(), "list")
	require.NoError(t, err, out)
	require.Contains(t, out, "no open incidents")
	out, err = runCmd(t, deadletterCmd(), "list")
	require.NoError(t, err, out)
	require.Contains(t, out, "no dead letters")
	_, err = runCmd(t, deadletterCmd(), "show", "7")
	require.ErrorContains(t, err, "404")
	_, err = runCmd(t, deadletterCmd(), "redrive", "7", "--reason", "fixed")
	require.ErrorContains(t, err, "404")

	evs, err := op.Actions(ctx, "T-cli-1", 10)
	require.NoError(t, err)
	require.Len(t, evs, 3, "pause, resolve and settle recorded, once each")
}

// The commands wait for what the service reports it did and exit by it:
// 1 when it refused the action, 3 when it did not report it in time.
func TestActionExitCodes(t *testing.T) {
	ctx := context.Background()
	pool, _ := testenv.SchemaPool(t, reconciler.Schema, tripsql.SetSaga, tripsql.SetReconciler)
	_, _, js := testenv.JetStream(t)
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	var mu sync.Mutex
	effect := ""
	var lastEvent atomic.Value // the action whose effect the fake reports
	svc := http.NewServeMux()
	svc.HandleFunc("GET /steps/{trip}", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"items":[{"trip_id":"`+r.PathValue("trip")+`","step":"payment","status":"compensating"}]}`)
	})
	svc.HandleFunc("GET /operator/{trip}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if effect == "" {
			_, _ = io.WriteString(w, `{"items":[]}`)
			return
		}
		// The fake reports the effect for the action the test recorded.
		_, _ = fmt.Fprintf(w, `{"items":[{"event_id":%q,"trip_id":%q,"effect":%q}]}`, lastEvent.Load(), r.PathValue("trip"), effect)
	})
	payment := httptest.NewServer(svc)
	t.Cleanup(payment.Close)
	r, err := reconciler.New(reconciler.Config{Pool: pool, JetStream: js, Interval: time.Hour,
		Companies: map[string]*provider.Client{"hotel": provider.Hotel("http://127.0.0.1:1"), "payment": provider.Payments("http://127.0.0.1:1"), "car": provider.Cars("http://127.0.0.1:1")},
		Services:  map[string]string{"payment": payment.URL}})
	require.NoError(t, err)
	op, err := reconciler.NewOperator(reconciler.OperatorConfig{Reconciler: r, Token: "tok-2"})
	require.NoError(t, err)
	mux := http.NewServeMux()
	op.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv("RECONCILER_URL", srv.URL)
	t.Setenv("OPERATOR_TOKEN", "tok-2")

	// Not reported within --wait: recorded, exit 3.
	out, err := runCmd(t, incidentsCmd(), "retry", "T-exit-1", "--service", "payment", "--reason", "r", "--wait", "300ms", "--key", "X-1")
	var xe exitCodeError
	require.ErrorAs(t, err, &xe, out)
	require.Equal(t, 3, xe.code)
	require.ErrorContains(t, err, "has not reported what it did")
	lastEvent.Store(eventIDIn(t, out))

	// Refused by the service: exit 1, its words printed.
	mu.Lock()
	effect = "refused: step payment is forward-only, never undone"
	mu.Unlock()
	out, err = runCmd(t, incidentsCmd(), "retry", "T-exit-1", "--service", "payment", "--reason", "r", "--key", "X-1")
	require.ErrorAs(t, err, &xe, out)
	require.Equal(t, 1, xe.code)
	require.Contains(t, out, "payment: refused: step payment is forward-only")

	// Done: exit 0.
	mu.Lock()
	effect = "1 unfinished step(s) due now"
	mu.Unlock()
	out, err = runCmd(t, incidentsCmd(), "retry", "T-exit-1", "--service", "payment", "--reason", "r", "--key", "X-1")
	require.NoError(t, err, out)
	require.Contains(t, out, "payment: 1 unfinished step(s) due now")
}

// eventIDIn returns the event id of the action a command printed
// ("...: event <id>, Idempotency-Key ...").
func eventIDIn(t *testing.T, out string) string {
	t.Helper()
	_, rest, ok := strings.Cut(out, ": event ")
	require.True(t, ok, out)
	id, _, _ := strings.Cut(rest, ",")
	return id
}
