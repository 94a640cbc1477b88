package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// errorLog is a slog handler that keeps the messages of error records.
type errorLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *errorLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *errorLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *errorLog) WithGroup(string) slog.Handler            { return l }
func (l *errorLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		l.mu.Lock()
		l.msgs = append(l.msgs, r.Message)
		l.mu.Unlock()
	}
	return nil
}

func (l *errorLog) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

func publishEvent(t *testing.T, js jetstream.JetStream, e event.Event) {
	t.Helper()
	require.NoError(t, tryPublish(js, e))
}

func tryPublish(js jetstream.JetStream, e event.Event) error {
	h, err := events.EncodeHeaders(e)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: "hotel.held." + e.Subject(), Data: e.Data(), Header: nats.Header{}}
	for k, v := range h {
		m.Header[k] = []string{v}
	}
	_, err = js.PublishMsg(context.Background(), m, jetstream.WithMsgID(e.ID()))
	return err
}

// effectsTable makes a table without a key, so a second effect of one
// event would show as a second row.
func effectsTable(t *testing.T, b *bundle) (HandlerFunc, func() (rows, distinct int)) {
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "CREATE TABLE effects (event_id text NOT NULL)")
	require.NoError(t, err)
	h := func(ctx context.Context, tx pgx.Tx, e event.Event) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", e.ID())
		return err
	}
	count := func() (rows, distinct int) {
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT event_id) FROM effects").Scan(&rows, &distinct))
		return rows, distinct
	}
	return h, count
}

// lostCount sums tripsaga_inbox_consumer_lost_total of consumer in reg.
func lostCount(t *testing.T, reg *prometheus.Registry, consumer string) float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "tripsaga_inbox_consumer_lost_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "consumer" && l.GetValue() == consumer {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

func runInbox(t *testing.T, in *Inbox) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// TestInboxConsumerLost deletes the inbox's durable consumer twice while
// events flow: the inbox notices, logs at error level, counts it, and
// recreates the consumer from its position (the ack floor it recorded in
// inbox_position), and every event has exactly one effect.
func TestInboxConsumerLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	effect, effects := effectsTable(t, b)
	logs := &errorLog{}
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	require.NoError(t, err)
	in, err := New(Config{
		Name: "lost", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
		Types: []string{events.HotelHeld}, Pool: b.pool, JetStream: b.js,
		Handler: effect, BatchApply: HandlerBatch(effect), BatchSize: 16,
		Logger: slog.New(logs), Metrics: metrics, WatchInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	runInbox(t, in)

	// Events flow all along: a publisher sends one every millisecond or so
	// until the deletions are done.
	var mu sync.Mutex
	sent := 0
	stop, pubDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			e, err := events.New(events.Source("hotel"), events.HotelHeld, fmt.Sprintf("T-%d", i), events.StepData{TripID: fmt.Sprintf("T-%d", i), Step: "hotel"})
			if err == nil {
				err = tryPublish(b.js, e)
			}
			if err != nil {
				t.Errorf("publish %d: %v", i, err)
				return
			}
			mu.Lock()
			sent++
			mu.Unlock()
		}
	}()
	published := func() int {
		mu.Lock()
		defer mu.Unlock()
		return sent
	}
	position := func() int64 {
		var f int64
		err := b.pool.QueryRow(ctx, "SELECT COALESCE(max(ack_floor), 0) FROM inbox_position WHERE consumer = 'lost' AND stream = $1", events.StreamHotel).Scan(&f)
		require.NoError(t, err)
		return f
	}
	lost := func() float64 { return lostCount(t, reg, "lost") }
	var starts []uint64
	for round := 1; round <= 2; round++ {
		before := position()
		testenv.Eventually(t, func() bool { return position() > before }, "round %d: the inbox records a new position", round)
		floor := position()
		require.NoError(t, b.js.DeleteConsumer(ctx, events.StreamHotel, "lost"))
		testenv.Eventually(t, func() bool { return lost() >= float64(round) }, "round %d: the loss is counted", round)
		var info *jetstream.ConsumerInfo
		testenv.Eventually(t, func() bool {
			c, err := b.js.Consumer(ctx, events.StreamHotel, "lost")
			if err != nil {
				return false
			}
			info = c.CachedInfo()
			return true
		}, "round %d: the consumer is recreated", round)
		require.Equal(t, jetstream.DeliverByStartSequencePolicy, info.Config.DeliverPolicy, "recreated from the inbox's position, not from the stream's start")
		require.GreaterOrEqual(t, info.Config.OptStartSeq, uint64(floor)+1, "no earlier than the position recorded before the delete")
		starts = append(starts, info.Config.OptStartSeq)
	}
	require.Greater(t, starts[1], starts[0])
	n := published()
	testenv.Eventually(t, func() bool { return published() >= n+50 }, "events are published after the last delete")
	close(stop)
	<-pubDone
	total := published()
	testenv.Eventually(t, func() bool { _, d := effects(); return d == total }, "every event has its effect")
	testenv.Eventually(t, func() bool { return in.Check(ctx) == nil }, "the inbox is ready again")
	rows, distinct := effects()
	require.Equal(t, total, distinct, "none lost")
	require.Equal(t, total, rows, "none handled twice")
	require.GreaterOrEqual(t, logs.count("durable consumer lost"), 2, "each loss is logged at error level")
}

// TestInboxConsumerThatWouldSkipIsRecreated: a consumer of the inbox's
// name made by someone else to deliver only new events (an operator's
// mistake) would skip what is already in the stream: Run deletes it and
// creates it from the inbox's position (unknown here: from the start).
func TestInboxConsumerThatWouldSkipIsRecreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	effect, effects := effectsTable(t, b)
	for i := range 20 {
		publishEvent(t, b.js, newEvent(t, fmt.Sprintf("T-%d", i)))
	}
	_, err := b.js.CreateConsumer(ctx, events.StreamHotel, jetstream.ConsumerConfig{
		Durable: "skip", FilterSubjects: []string{"hotel.held.>"}, AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverNewPolicy,
	})
	require.NoError(t, err)
	logs := &errorLog{}
	in, err := New(Config{
		Name: "skip", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
		Types: []string{events.HotelHeld}, Pool: b.pool, JetStream: b.js, Handler: effect, Logger: slog.New(logs),
	})
	require.NoError(t, err)
	runInbox(t, in)
	testenv.Eventually(t, func() bool { _, d := effects(); return d == 20 }, "the events already in the stream are handled")
	require.Equal(t, 1, logs.count("starts after the inbox's position"))
}

// TestInboxStartSeq: one past the stored position, or the stream's start
// when the stream ends before it (restored or recreated).
func TestInboxStartSeq(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	effect, _ := effectsTable(t, b)
	for i := range 10 {
		publishEvent(t, b.js, newEvent(t, fmt.Sprintf("T-%d", i)))
	}
	in, err := New(Config{
		Name: "start", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
		Types: []string{events.HotelHeld}, Pool: b.pool, JetStream: b.js, Handler: effect,
	})
	require.NoError(t, err)
	seq, err := in.StartSeq(ctx)
	require.NoError(t, err)
	require.Zero(t, seq, "no position: deliver all")
	_, err = b.pool.Exec(ctx, "INSERT INTO inbox_position (consumer, stream, ack_floor) VALUES ('start', $1, 7)", events.StreamHotel)
	require.NoError(t, err)
	seq, err = in.StartSeq(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(8), seq)
	_, err = b.pool.Exec(ctx, "UPDATE inbox_position SET ack_floor = 1000")
	require.NoError(t, err)
	seq, err = in.StartSeq(ctx)
	require.NoError(t, err)
	require.Zero(t, seq, "the stream ends before the position: deliver all")
}

// TestInboxNATSRestartIsNotALoss: a NATS server stopped and started again
// on its store keeps the consumer (same creation time, same ack floor), so
// the inbox counts no loss and goes on.
func TestInboxNATSRestartIsNotALoss(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.SchemaPool(t, "svc", tripsql.SetSaga)
	srv, opts := testenv.NATSWith(t, nil)
	opts.Port = srv.Addr().(*net.TCPAddr).Port
	nc := testenv.Connect(t, srv, natsauth.Admin, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	b := &bundle{pool: pool, js: js, nc: nc}
	effect, effects := effectsTable(t, b)
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	require.NoError(t, err)
	in, err := New(Config{
		Name: "restart", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
		Types: []string{events.HotelHeld}, Pool: pool, JetStream: js, Handler: effect,
		Metrics: metrics, WatchInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	runInbox(t, in)
	for i := range 20 {
		publishEvent(t, js, newEvent(t, fmt.Sprintf("T-a%d", i)))
	}
	testenv.Eventually(t, func() bool { _, d := effects(); return d == 20 }, "the first events are handled")

	srv.Shutdown()
	srv.WaitForShutdown()
	srv2, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv2.Start()
	t.Cleanup(func() { srv2.Shutdown(); srv2.WaitForShutdown() })
	require.True(t, srv2.ReadyForConnections(10*time.Second))
	testenv.Eventually(t, nc.IsConnected, "the client reconnects")
	for i := range 20 {
		publishEvent(t, js, newEvent(t, fmt.Sprintf("T-b%d", i)))
	}
	testenv.Eventually(t, func() bool { _, d := effects(); return d == 40 }, "the events after the restart are handled")
	testenv.Eventually(t, func() bool { return in.Check(ctx) == nil }, "the inbox is ready")
	require.Zero(t, lostCount(t, reg, "restart"), "a restart is not a lost consumer")
}
