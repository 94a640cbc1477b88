package inbox

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/outbox"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// TestFaultPointsOfTheBatchPaths arms the relay's and the inbox's fault
// points with error (once, for this test's trips only) on their batch
// paths, which the end-to-end test may not reach: a batch relay that
// fails between publish and mark publishes again and JetStream keeps one
// copy; an inbox batch whose acks are lost after its commit is redelivered
// and acked as duplicates, each event's effect made once.
func TestFaultPointsOfTheBatchPaths(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, fault.Setup(fault.HotelRelayAfterPublish+":error:once=relay:trip=T-fpr,"+fault.HotelInboxAfterCommit+":error:once=inbox:trip=T-fpi", "", dir))
	defer func() { _ = fault.Setup("", "", "") }()
	ctx := context.Background()

	t.Run("relay", func(t *testing.T) {
		pool, _ := testenv.SchemaPool(t, "hotel", tripsql.SetSaga) // the relay's service: its schema
		_, _, js := testenv.JetStream(t)
		var evs []event.Event
		for i := range 5 {
			evs = append(evs, newEvent(t, fmt.Sprintf("T-fpr%d", i)))
		}
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, outbox.Write(ctx, tx, evs...)) // no local publish: the batch claims them
		require.NoError(t, tx.Commit(ctx))
		r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, JetStream: js, PollInterval: 50 * time.Millisecond})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = r.Run(rctx); close(done) }()
		defer func() { cancel(); <-done }()
		testenv.Eventually(t, func() bool {
			var n int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE published_at IS NULL").Scan(&n))
			return n == 0
		}, "every row is marked at last")
		_, err = os.Stat(fault.Marker(dir, "relay"))
		require.NoError(t, err, "the fault fired")
		s, err := js.Stream(ctx, events.StreamHotel)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		require.EqualValues(t, len(evs), info.State.Msgs, "published twice, kept once")
	})

	t.Run("inbox", func(t *testing.T) {
		b := setup(t)
		_, err := b.pool.Exec(ctx, "CREATE TABLE effects (event_id text PRIMARY KEY)")
		require.NoError(t, err)
		effect := func(ctx context.Context, tx pgx.Tx, e event.Event) error {
			_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", e.ID())
			return err
		}
		const n = 50
		for i := range n { // in the stream before the consumer starts: batches form
			e := newEvent(t, fmt.Sprintf("T-fpi%d", i))
			h, err := events.EncodeHeaders(e)
			require.NoError(t, err)
			m := &nats.Msg{Subject: "hotel.held." + e.Subject(), Data: e.Data(), Header: nats.Header{}}
			for k, v := range h {
				m.Header[k] = []string{v}
			}
			_, err = b.js.PublishMsg(ctx, m, jetstream.WithMsgID(e.ID()))
			require.NoError(t, err)
		}
		var batched int
		in, err := New(Config{
			Name: "hotel", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
			Types: []string{events.HotelHeld}, Pool: b.pool, JetStream: b.js, Handler: effect,
			BatchApply: func(ctx context.Context, tx pgx.Tx, consumer string, ds []Delivery) error {
				batched += len(ds) // Concurrency 1: one batch at a time
				return HandlerBatch(effect)(ctx, tx, consumer, ds)
			},
			Concurrency: 1, BatchSize: 16, AckWait: 3 * time.Second,
		})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = in.Run(rctx); close(done) }()
		defer func() { cancel(); <-done }()
		testenv.Eventually(t, func() bool {
			cons, err := b.js.Consumer(ctx, events.StreamHotel, "hotel")
			if err != nil {
				return false
			}
			info, err := cons.Info(ctx)
			return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && info.AckFloor.Stream == n
		}, "every event is acked at last")
		_, err = os.Stat(fault.Marker(dir, "inbox"))
		require.NoError(t, err, "the fault fired")
		var effects int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM effects").Scan(&effects))
		require.Equal(t, n, effects, "one effect per event")
		require.Positive(t, batched, "events were applied in batches")
	})
}
