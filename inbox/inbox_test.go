package inbox

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/outbox"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type bundle struct {
	pool *pgxpool.Pool
	js   jetstream.JetStream
	nc   *nats.Conn
	srv  interface{ Shutdown() }
}

func setup(t *testing.T) *bundle { return setupB(t) }

func setupB(t testing.TB) *bundle {
	t.Helper()
	pool, _ := testenv.SchemaPool(t, "svc", tripsql.SetSaga)
	srv, nc, js := testenv.JetStream(t)
	return &bundle{pool: pool, js: js, nc: nc, srv: srv}
}

func newEvent(t *testing.T, trip string) event.Event {
	e, err := events.New(events.Source("hotel"), events.HotelHeld, trip, events.StepData{TripID: trip, Step: "hotel"})
	require.NoError(t, err)
	return e
}

func writeEvents(t *testing.T, b *bundle, evs ...event.Event) {
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Write(ctx, tx, evs...))
	require.NoError(t, tx.Commit(ctx))
}

func drain(t *testing.T, r *outbox.Relay) {
	for {
		n, err := r.PublishBatch(context.Background())
		require.NoError(t, err)
		if n == 0 {
			return
		}
	}
}

func TestInbox(t *testing.T) {
	t.Parallel()

	type seen struct {
		mu  sync.Mutex
		ids []string
	}
	start := func(t *testing.T, b *bundle, h HandlerFunc) *Inbox {
		in, err := New(Config{
			Name: "test", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
			Types: []string{events.HotelHeld}, Pool: b.pool, JetStream: b.js, Handler: h,
			MaxDeliver: 3, BackoffMax: 50 * time.Millisecond,
		})
		require.NoError(t, err)
		require.ErrorContains(t, in.Check(context.Background()), "not created yet")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = in.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		return in
	}
	publish := func(t *testing.T, b *bundle, e event.Event, msgID string) {
		h, err := events.EncodeHeaders(e)
		require.NoError(t, err)
		m := &nats.Msg{Subject: "hotel.held." + e.Subject(), Data: e.Data(), Header: nats.Header{}}
		for k, v := range h {
			m.Header[k] = []string{v}
		}
		_, err = b.js.PublishMsg(context.Background(), m, jetstream.WithMsgID(msgID))
		require.NoError(t, err)
	}
	counter := func(t *testing.T, b *bundle, s *seen) HandlerFunc {
		return func(ctx context.Context, tx pgx.Tx, e event.Event) error {
			// The effect lives in the same transaction as the inbox row.
			if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS effects (event_id text)"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", e.ID()); err != nil {
				return err
			}
			s.mu.Lock()
			s.ids = append(s.ids, e.ID())
			s.mu.Unlock()
			return nil
		}
	}
	effects := func(t *testing.T, b *bundle, id string) int {
		var n int
		err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM effects WHERE event_id = $1", id).Scan(&n)
		if err != nil {
			return -1
		}
		return n
	}
	deadLetters := func(t *testing.T, b *bundle) []*jetstream.RawStreamMsg {
		ctx := context.Background()
		s, err := b.js.Stream(ctx, events.StreamDeadLetter)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		var out []*jetstream.RawStreamMsg
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			m, err := s.GetMsg(ctx, seq)
			require.NoError(t, err)
			out = append(out, m)
		}
		return out
	}

	t.Run("DuplicateDeliveryHasOneEffect", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var s seen
		in := start(t, b, counter(t, b, &s))
		e := newEvent(t, "T-dup")
		publish(t, b, e, "a")
		publish(t, b, e, "b") // same event, past broker dedup (another msg id)
		marker := newEvent(t, "T-marker")
		publish(t, b, marker, "c")
		testenv.Eventually(t, func() bool { return effects(t, b, marker.ID()) == 1 }, "marker handled")
		testenv.Eventually(t, func() bool {
			info, err := b.js.Consumer(context.Background(), events.StreamHotel, "test")
			return err == nil && func() bool {
				i, err := info.Info(context.Background())
				return err == nil && i.NumAckPending == 0 && i.NumPending == 0
			}()
		}, "all acked")
		require.Equal(t, 1, effects(t, b, e.ID()))
		require.NoError(t, in.Check(context.Background()), "a consumer with nothing waiting is not stalled")
	})

	t.Run("PoisonEventIsParkedAndDoesNotBlock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var s seen
		start(t, b, counter(t, b, &s))
		_, err := b.js.PublishMsg(context.Background(), &nats.Msg{Subject: "hotel.held.T-x", Data: []byte("garbage"), Header: nats.Header{"ce-id": {"1"}}})
		require.NoError(t, err)
		unknown, err := events.New(events.Source("hotel"), "io.tripsaga.hotel.upgraded.v1", "T-u", map[string]string{})
		require.NoError(t, err)
		h, _ := events.EncodeHeaders(unknown)
		m := &nats.Msg{Subject: "hotel.held.T-u", Data: unknown.Data(), Header: nats.Header{}}
		for k, v := range h {
			m.Header[k] = []string{v}
		}
		_, err = b.js.PublishMsg(context.Background(), m)
		require.NoError(t, err)
		good := newEvent(t, "T-good")
		publish(t, b, good, "good")
		testenv.Eventually(t, func() bool { return effects(t, b, good.ID()) == 1 }, "good event handled after poison")
		testenv.Eventually(t, func() bool { return len(deadLetters(t, b)) == 2 }, "two parked")
		dl := deadLetters(t, b)
		require.Contains(t, dl[0].Header.Get(HeaderDeadReason)+dl[1].Header.Get(HeaderDeadReason), "cannot decode")
		require.Contains(t, dl[0].Header.Get(HeaderDeadReason)+dl[1].Header.Get(HeaderDeadReason), "unknown event type")
		for _, m := range dl {
			if m.Header.Get(HeaderDeadSubject) == "hotel.held.T-x" {
				require.Equal(t, "garbage", string(m.Data), "the original body is kept")
				require.Contains(t, m.Header.Get(HeaderDeadReason), "cannot decode")
			}
		}
	})

	t.Run("FailingHandlerIsRetriedThenParked", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var calls atomic.Int64
		start(t, b, func(ctx context.Context, tx pgx.Tx, e event.Event) error {
			calls.Add(1)
			return errors.New("company down")
		})
		publish(t, b, newEvent(t, "T-fail"), "f")
		testenv.Eventually(t, func() bool { return len(deadLetters(t, b)) == 1 }, "parked after MaxDeliver")
		require.EqualValues(t, 3, calls.Load())
		require.Contains(t, deadLetters(t, b)[0].Header.Get(HeaderDeadReason), "still failing after 3 deliveries: company down")
	})

	t.Run("PanicIsAnErrorNotACrash", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		start(t, b, func(ctx context.Context, tx pgx.Tx, e event.Event) error {
			panic("boom")
		})
		publish(t, b, newEvent(t, "T-panic"), "p")
		testenv.Eventually(t, func() bool { return len(deadLetters(t, b)) == 1 }, "parked")
		require.Contains(t, deadLetters(t, b)[0].Header.Get(HeaderDeadReason), "handler panic: boom")
	})
}
