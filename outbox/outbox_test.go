package outbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
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
	require.NoError(t, Write(ctx, tx, evs...))
	require.NoError(t, tx.Commit(ctx))
}

// streamIDs returns the ce-id of every message on HOTEL, in stream order.
func streamIDs(t *testing.T, b *bundle) []string {
	ctx := context.Background()
	s, err := b.js.Stream(ctx, events.StreamHotel)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	var ids []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		ids = append(ids, m.Header.Get("ce-id"))
	}
	return ids
}

func drain(t *testing.T, r *Relay) {
	for {
		n, err := r.PublishBatch(context.Background())
		require.NoError(t, err)
		if n == 0 {
			return
		}
	}
}

func TestRelay(t *testing.T) {
	t.Parallel()

	t.Run("PublishesWithMsgIDAndMarksSent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e1, e2 := newEvent(t, "T-1"), newEvent(t, "T-2")
		writeEvents(t, b, e1, e2)
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js})
		require.NoError(t, err)
		drain(t, r)
		require.Equal(t, []string{e1.ID(), e2.ID()}, streamIDs(t, b))
		n, err := Pending(context.Background(), b.pool)
		require.NoError(t, err)
		require.Zero(t, n)
	})

	t.Run("NeverSkipsARowWhoseTransactionCommitsLate", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		late := newEvent(t, "T-late")
		txLate, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, Write(ctx, txLate, late)) // takes the lower id
		early := newEvent(t, "T-early")
		writeEvents(t, b, early) // higher id, commits first
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js})
		require.NoError(t, err)
		drain(t, r)
		require.Equal(t, []string{early.ID()}, streamIDs(t, b))
		require.NoError(t, txLate.Commit(ctx))
		drain(t, r)
		require.Equal(t, []string{early.ID(), late.ID()}, streamIDs(t, b))
	})

	// A crash between the publish and the mark (the fault point
	// <service>.relay.after_publish): TestFaultPointsOfTheBatchPaths in
	// package inbox, which arms it.

	t.Run("SeveralRelaysPublishEveryEventOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		const total = 600
		want := map[string]bool{}
		for i := 0; i < total; i += 50 {
			var evs []event.Event
			for j := 0; j < 50; j++ {
				e := newEvent(t, fmt.Sprintf("T-%d", i+j))
				want[e.ID()] = true
				evs = append(evs, e)
			}
			writeEvents(t, b, evs...)
		}
		var wg sync.WaitGroup
		var claimed atomic.Int64
		for range 3 {
			r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, BatchSize: 40})
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					n, err := r.PublishBatch(ctx)
					if err != nil || n == 0 {
						return
					}
					claimed.Add(int64(n))
				}
			}()
		}
		wg.Wait()
		require.EqualValues(t, total, claimed.Load(), "no row claimed twice")
		ids := streamIDs(t, b)
		require.Len(t, ids, total)
		for _, id := range ids {
			require.True(t, want[id])
		}
	})

	t.Run("AnOutageNeverCountsTowardsQuarantine", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		writeEvents(t, b, newEvent(t, "T-outage"))
		b.srv.Shutdown()
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, MaxAttempts: 1, AckTimeout: 200 * time.Millisecond})
		require.NoError(t, err)
		for range 3 {
			testenv.Eventually(t, func() bool {
				_, err := r.PublishBatch(context.Background())
				return err != nil // the row is due again after its backoff
			}, "the relay tries again")
		}
		var attempts, outages int
		var quarantined bool
		var cause string
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT attempts, outages, last_cause, quarantined_at IS NOT NULL FROM outbox").Scan(&attempts, &outages, &cause, &quarantined))
		require.Zero(t, attempts)
		require.GreaterOrEqual(t, outages, 3)
		require.Contains(t, []string{string(CauseDisconnected), string(CauseTimeout)}, cause)
		require.False(t, quarantined, "the event waits for NATS to come back")
		n, err := Pending(context.Background(), b.pool)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
	})

	t.Run("RunWakesOnNotify", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, PollInterval: time.Hour})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = r.Run(ctx) }()
		e := newEvent(t, "T-notify")
		writeEvents(t, b, e)
		testenv.Eventually(t, func() bool { return len(streamIDs(t, b)) == 1 }, "event published after NOTIFY")
	})

	t.Run("RejectsBackoffOutsideDuplicateWindow", func(t *testing.T) {
		_, err := NewRelay(RelayConfig{Pool: &pgxpool.Pool{}, JetStream: nil})
		require.ErrorIs(t, err, ErrInvalidConfig)
	})
}
