package inbox

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

func TestInboxBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "CREATE TABLE effects (event_id text PRIMARY KEY)")
	require.NoError(t, err)

	effect := func(ctx context.Context, tx pgx.Tx, e event.Event) error {
		if strings.HasPrefix(e.Subject(), "T-bad") {
			return fmt.Errorf("%w: trip %s cannot be applied", ErrPermanent, e.Subject())
		}
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", e.ID())
		return err
	}
	var batches, batched atomic.Int64
	batch := func(ctx context.Context, tx pgx.Tx, consumer string, ds []Delivery) error {
		batches.Add(1)
		if err := HandlerBatch(effect)(ctx, tx, consumer, ds); err != nil {
			return err
		}
		batched.Add(int64(len(ds)))
		return nil
	}

	// Events are in the stream before the consumer starts, so batches
	// form; a bad event and a duplicate delivery are among them.
	var good []event.Event
	publish := func(e event.Event, msgID string) {
		h, err := events.EncodeHeaders(e)
		require.NoError(t, err)
		m := &nats.Msg{Subject: "hotel.held." + e.Subject(), Data: e.Data(), Header: nats.Header{}}
		for k, v := range h {
			m.Header[k] = []string{v}
		}
		_, err = b.js.PublishMsg(ctx, m, jetstream.WithMsgID(msgID))
		require.NoError(t, err)
	}
	for i := range 300 {
		e := newEvent(t, fmt.Sprintf("T-%d", i))
		good = append(good, e)
		publish(e, e.ID())
		if i == 150 {
			publish(newEvent(t, "T-bad"), "bad")
			publish(e, "again") // the same event once more
		}
	}
	in, err := New(Config{
		Name: "batch", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
		Types: []string{events.HotelHeld}, Pool: b.pool, JetStream: b.js, Handler: effect, BatchApply: batch,
		Concurrency: 1, BatchSize: 64, MaxDeliver: 3,
	})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = in.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()

	testenv.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM effects").Scan(&n))
		return n == len(good)
	}, "every good event has its effect")
	testenv.Eventually(t, func() bool {
		s, err := b.js.Stream(ctx, events.StreamDeadLetter)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		return info.State.Msgs == 1
	}, "the bad event is parked")
	var effects, inbox int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT event_id) FROM effects").Scan(&effects, &inbox))
	require.Equal(t, len(good), effects, "one effect per event, the duplicate included")
	require.Positive(t, batched.Load(), "events were applied in batches")
	require.Less(t, batches.Load(), int64(len(good)), "fewer transactions than events")
}
