package inbox

import (
	"context"
	"errors"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// TestReadinessOfInboxes checks what fails readiness and what is only
// waited for: an inbox whose stream does not exist (not created yet, or
// deleted under its running consumer) is a wait naming the stream, never
// an error; an inbox whose stream exists but whose consumer is not
// created fails readiness, unless the inbox is Optional, which never
// fails it.
func TestReadinessOfInboxes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, _, js := testenv.JetStream(t)
	pool, _ := testenv.SchemaPool(t, "svc", tripsql.SetSaga)
	require.NoError(t, js.DeleteStream(ctx, events.StreamPayment))
	inbox := func(stream, filter, typ string, optional bool) *Inbox {
		in, err := New(Config{
			Name: "car", Stream: stream, FilterSubjects: []string{filter}, Types: []string{typ},
			Pool: pool, JetStream: js, Optional: optional,
			Handler: func(context.Context, pgx.Tx, event.Event) error { return nil },
		})
		require.NoError(t, err)
		return in
	}
	payment := inbox(events.StreamPayment, "payment.charged.>", events.PaymentCharged, false)
	trips := inbox(events.StreamTrips, "trip.cancellation_requested.>", events.TripCancellationRequested, false)
	operator := inbox(events.StreamOperator, "operator.action.>", events.OperatorAction, true)

	waits, err := Readiness(ctx, payment, trips, operator)
	require.ErrorContains(t, err, "inbox car: consumer on TRIPS not created yet", "a consumer not created on a stream that exists fails readiness")
	require.Len(t, waits, 2)
	require.Equal(t, events.StreamPayment, waits[0].Stream)
	require.ErrorIs(t, waits[0].Err, ErrStreamMissing, "a missing stream is waited for")
	require.Equal(t, events.StreamOperator, waits[1].Stream)
	require.NotErrorIs(t, waits[1].Err, ErrStreamMissing)
	require.ErrorContains(t, waits[1].Err, "not created yet", "an optional inbox's trouble is a wait, never a failure")

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 3)
	for _, in := range []*Inbox{payment, trips, operator} {
		go func() { _ = in.Run(rctx); done <- struct{}{} }()
	}
	t.Cleanup(func() {
		cancel()
		for range 3 {
			<-done
		}
	})
	testenv.Eventually(t, func() bool {
		waits, err := Readiness(ctx, payment, trips, operator)
		return err == nil && len(waits) == 1 && waits[0].Stream == events.StreamPayment
	}, "ready, waiting for PAYMENT only")

	require.NoError(t, events.EnsureStreams(ctx, js, events.Selected()))
	// Until the inbox's next look (within StreamWaitMax) the stream exists
	// and its consumer does not: that fails no readiness either.
	waits, err = Readiness(ctx, payment, trips, operator)
	require.NoError(t, err, "a stream that has just appeared fails no readiness")
	for _, w := range waits {
		require.ErrorIs(t, w.Err, ErrStreamAppeared, "%s", w.Stream)
	}
	testenv.Eventually(t, func() bool {
		waits, err := Readiness(ctx, payment, trips, operator)
		return err == nil && len(waits) == 0
	}, "PAYMENT appeared: its consumer is created and nothing is waited for")

	// The stream is deleted under the running consumer.
	require.NoError(t, js.DeleteStream(ctx, events.StreamPayment))
	testenv.Eventually(t, func() bool {
		waits, err := Readiness(ctx, payment, trips, operator)
		return err == nil && len(waits) == 1 && waits[0].Stream == events.StreamPayment && waits[0].Err != nil &&
			errors.Is(waits[0].Err, ErrStreamMissing)
	}, "a deleted stream is waited for, without failing readiness")
}
