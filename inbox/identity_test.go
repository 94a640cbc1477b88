package inbox

import (
	"context"
	"sync"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// TestInboxAsItsIdentityWaitsForAStreamNotYetCreated (issue 9 item 1): the
// car's inbox, connected as the car's NATS identity, starts before the
// PAYMENT stream exists (each service creates only its own stream, so
// processes start in any order): it waits, and once the payment service
// (as its own identity) has made the stream and published payment.charged,
// the car's consumer is created, the event handled and acked, all within
// the car's permissions.
func TestInboxAsItsIdentityWaitsForAStreamNotYetCreated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testenv.NATS(t)
	pool, _ := testenv.SchemaPool(t, "svc", tripsql.SetSaga)
	carJS, err := jetstream.New(testenv.Connect(t, srv, "car"))
	require.NoError(t, err)

	var mu sync.Mutex
	var got []string
	in, err := New(Config{
		Name: "car", Stream: events.StreamPayment, FilterSubjects: []string{"payment.charged.>"},
		Types: []string{events.PaymentCharged}, Pool: pool, JetStream: carJS,
		Handler: func(_ context.Context, _ pgx.Tx, e event.Event) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, e.Subject())
			return nil
		},
	})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(rctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	require.ErrorIs(t, in.Check(ctx), ErrStreamMissing, "the car's identity may read PAYMENT's info: Check says the stream does not exist yet")
	waits, err := Readiness(ctx, in)
	require.NoError(t, err, "a stream not created yet fails no readiness")
	require.Len(t, waits, 1)
	payJS, err := jetstream.New(testenv.Connect(t, srv, "payment"))
	require.NoError(t, err)
	require.NoError(t, events.EnsureServiceStreams(ctx, payJS, events.Selected(), "payment", 1))
	e, err := events.New("/tripsaga/payment", events.PaymentCharged, "T-order", events.StepData{TripID: "T-order"})
	require.NoError(t, err)
	h, err := events.EncodeHeaders(e)
	require.NoError(t, err)
	m := &nats.Msg{Subject: "payment.charged.T-order", Data: e.Data(), Header: nats.Header{}}
	for k, v := range h {
		m.Header[k] = []string{v}
	}
	_, err = payJS.PublishMsg(ctx, m, jetstream.WithMsgID(e.ID()))
	require.NoError(t, err)

	testenv.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 1
	}, "the car's inbox never handled the payment.charged published after it started")
	testenv.Eventually(t, func() bool {
		c, err := carJS.Consumer(ctx, events.StreamPayment, "car")
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.AckFloor.Stream == 1
	}, "the car's consumer never acked the event")
}
