package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/reconciler"
	"github.com/tripsaga/tripsaga/sim"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// TestRedriveCommand drives `tripsaga redrive` against a real
// reconciler's API: the dry run lists the deliveries and needs no token,
// the re-drive records one action a delivery, the same --key records once.
func TestRedriveCommand(t *testing.T) {
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
	op.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { _ = op.Run(rctx); done <- struct{}{} }()
	go func() { _ = r.Run(rctx, nil); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	t.Setenv("RECONCILER_URL", srv.URL)

	trip := "T-cli-redrive"
	for _, typ := range []string{events.TripRequested, events.HotelHeld, events.PaymentCharged} {
		e, err := events.New(events.Source("x"), typ, trip, map[string]string{"trip_id": trip})
		require.NoError(t, err)
		h, err := events.EncodeHeaders(e)
		require.NoError(t, err)
		subj, err := events.Subject(typ, trip)
		require.NoError(t, err)
		m := &nats.Msg{Subject: subj, Data: e.Data(), Header: nats.Header{}}
		for k, v := range h {
			m.Header.Set(k, v)
		}
		_, err = js.PublishMsg(ctx, m, jetstream.WithMsgID(e.ID()))
		require.NoError(t, err)
	}
	// The projection's durable consumers exist once it consumes.
	testenv.Eventually(t, func() bool {
		_, err := js.Consumer(ctx, events.StreamPayment, reconciler.ProjectionName)
		_, err2 := js.Consumer(ctx, events.StreamHotel, reconciler.ProjectionName)
		return err == nil && err2 == nil
	}, "the reconciler's consumers on HOTEL and PAYMENT")

	t.Setenv("OPERATOR_TOKEN", "")
	_, err = runCmd(t, redriveCmd(), trip, "--reason", "x")
	require.ErrorContains(t, err, "--from-step is required")
	out, err := runCmd(t, redriveCmd(), trip, "--from-step", "payment", "--dry-run")
	require.NoError(t, err, out)
	require.Contains(t, out, "would deliver 2 event(s); nothing recorded")
	require.Regexp(t, `hotel\.held\s+HOTEL\s+1\s+\S+\s+reconciler\s+-`, out)
	require.Regexp(t, `payment\.charged\s+PAYMENT\s+1\s+\S+\s+reconciler\s+-`, out)
	require.Contains(t, out, "skipped:")
	_, err = runCmd(t, redriveCmd(), trip, "--from-step", "billing", "--dry-run")
	require.ErrorContains(t, err, "400")
	_, err = runCmd(t, redriveCmd(), trip, "--from-step", "payment", "--reason", "lost rows")
	require.ErrorContains(t, err, "OPERATOR_TOKEN is not set")

	t.Setenv("OPERATOR_TOKEN", "tok-1")
	_, err = runCmd(t, redriveCmd(), trip, "--from-step", "payment")
	require.ErrorContains(t, err, "--reason is required")
	out, err = runCmd(t, redriveCmd(), trip, "--from-step", "payment", "--reason", "lost rows", "--operator", "ada", "--key", "k-cli-from")
	require.NoError(t, err, out)
	require.Contains(t, out, "re-driven from step payment by ada: 2 action(s), Idempotency-Key k-cli-from")
	out, err = runCmd(t, redriveCmd(), trip, "--from-step", "payment", "--reason", "lost rows", "--operator", "ada", "--key", "k-cli-from")
	require.NoError(t, err, out)
	require.Contains(t, out, "was used for this re-drive already: 2 action(s) recorded then, none now")
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM operator_actions WHERE trip_id = $1", trip).Scan(&rows))
	require.Equal(t, 2, rows)
	require.False(t, strings.Contains(out, "trip.requested"), "before the payment step")
}
