package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox/internal/dbsqlc"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// lostReason is tripsaga_inbox_consumer_lost_total of consumer for one
// reason in reg.
func lostReason(t *testing.T, reg *prometheus.Registry, consumer, reason string) float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "tripsaga_inbox_consumer_lost_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["consumer"] == consumer && labels["reason"] == reason {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// startInbox runs in until the returned stop is called (or the test ends).
func startInbox(t *testing.T, in *Inbox) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-done)
		}
	}
	t.Cleanup(stop)
	return stop
}

// storedFloor is the ack floor inbox_position holds for consumer on HOTEL.
func storedFloor(t *testing.T, b *bundle, consumer string) int64 {
	var f int64
	err := b.pool.QueryRow(context.Background(), "SELECT COALESCE(max(ack_floor), 0) FROM inbox_position WHERE consumer = $1 AND stream = $2", consumer, events.StreamHotel).Scan(&f)
	require.NoError(t, err)
	return f
}

func publishN(t *testing.T, js jetstream.JetStream, prefix string, n int) {
	for i := range n {
		publishEvent(t, js, newEvent(t, fmt.Sprintf("T-%s%d", prefix, i)))
	}
}

func streamCreated(t *testing.T, js jetstream.JetStream) time.Time {
	s, err := js.Stream(context.Background(), events.StreamHotel)
	require.NoError(t, err)
	return s.CachedInfo().Created
}

// TestInboxStreamDeletedAndMadeAgain is the user's reproduction (issue
// 17) at the inbox: the consumer's service is down while its stream is
// deleted and made again and 6 events go into the new one (sequences 1 to
// 6, below and around the old position 4), and a replica that did not
// know better already made the consumer again from the old position
// (by_start_sequence 5). The service starts: it sees another stream
// (another creation time than inbox_position recorded), logs it at error
// level, counts it (reason stream_replaced), replaces the stale consumer
// by one that reads the new stream from its first message, and every
// event of both streams has exactly one effect.
func TestInboxStreamDeletedAndMadeAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	effect, effects := effectsTable(t, b)
	newInbox := func(logs *errorLog, reg *prometheus.Registry) *Inbox {
		metrics, err := NewMetrics(reg)
		require.NoError(t, err)
		in, err := New(Config{
			Name: "car", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
			Types: []string{events.HotelHeld}, Pool: b.pool, JetStream: b.js,
			Handler: effect, BatchApply: HandlerBatch(effect), BatchSize: 16,
			Logger: slog.New(logs), Metrics: metrics, WatchInterval: 50 * time.Millisecond,
		})
		require.NoError(t, err)
		return in
	}
	stop := startInbox(t, newInbox(&errorLog{}, prometheus.NewRegistry()))
	publishN(t, b.js, "old", 4)
	testenv.Eventually(t, func() bool { return storedFloor(t, b, "car") == 4 }, "the position 4 is recorded")
	old := streamCreated(t, b.js)
	stop()

	require.NoError(t, b.js.DeleteStream(ctx, events.StreamHotel))
	require.NoError(t, events.EnsureStreams(ctx, b.js, events.Default))
	require.NotEqual(t, old, streamCreated(t, b.js))
	publishN(t, b.js, "new", 6)
	_, err := b.js.CreateConsumer(ctx, events.StreamHotel, jetstream.ConsumerConfig{
		Durable: "car", FilterSubjects: []string{"hotel.held.>"}, AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 5,
	})
	require.NoError(t, err)
	// What the inbox would have done before: start after the position.
	in := newInbox(&errorLog{}, prometheus.NewRegistry())
	seq, err := in.StartSeq(ctx)
	require.NoError(t, err)
	require.Zero(t, seq, "on the new stream a consumer starts at its first message, not at 5")

	logs, reg := &errorLog{}, prometheus.NewRegistry()
	in = newInbox(logs, reg)
	startInbox(t, in)
	testenv.Eventually(t, func() bool { _, d := effects(); return d == 10 }, "all 4 old and 6 new events have their effect")
	testenv.Eventually(t, func() bool { return storedFloor(t, b, "car") == 6 }, "the position on the new stream is recorded")
	rows, distinct := effects()
	require.Equal(t, 10, distinct)
	require.Equal(t, 10, rows, "none handled twice")
	c, err := b.js.Consumer(ctx, events.StreamHotel, "car")
	require.NoError(t, err)
	require.Equal(t, jetstream.DeliverAllPolicy, c.CachedInfo().Config.DeliverPolicy, "the stale consumer was replaced, not taken up")
	require.Equal(t, 1.0, lostReason(t, reg, "car", LostStreamReplaced))
	require.Equal(t, 1, logs.count("the stream is not the one the inbox's position counts on"))
	require.Equal(t, 1, logs.count("starts after the inbox's position"), "the stale consumer is named")
	var created *time.Time
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT stream_created FROM inbox_position WHERE consumer = 'car'").Scan(&created))
	require.NotNil(t, created)
	require.True(t, created.Equal(streamCreated(t, b.js).Truncate(time.Microsecond)), "the new stream is recorded")
}

// TestInboxStreamReplacedUnderTwoReplicas: two replicas of a service
// consume one durable consumer while its stream is deleted and made again
// under them, twice, with events before and after: both notice (the
// consumer's deletion, the stream's creation time), decide one after the
// other under the inbox_position row lock, end on one consumer that reads
// the new stream from its start, and every event has exactly one effect.
func TestInboxStreamReplacedUnderTwoReplicas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	effect, effects := effectsTable(t, b)
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	require.NoError(t, err)
	for range 2 {
		in, err := New(Config{
			Name: "pair", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
			Types: []string{events.HotelHeld}, Pool: b.pool, JetStream: b.js, Handler: effect,
			Logger: slog.New(&errorLog{}), Metrics: metrics, WatchInterval: 50 * time.Millisecond,
		})
		require.NoError(t, err)
		startInbox(t, in)
	}
	total := 0
	for round := range 3 {
		publishN(t, b.js, fmt.Sprintf("r%d-", round), 5)
		total += 5
		testenv.Eventually(t, func() bool { _, d := effects(); return d == total }, "round %d: the events have their effect", round)
		testenv.Eventually(t, func() bool { return storedFloor(t, b, "pair") == 5 }, "round %d: the position is recorded", round)
		if round == 2 {
			break
		}
		require.NoError(t, b.js.DeleteStream(ctx, events.StreamHotel))
		require.NoError(t, events.EnsureStreams(ctx, b.js, events.Default))
	}
	rows, distinct := effects()
	require.Equal(t, total, distinct)
	require.Equal(t, total, rows, "none handled twice")
	c, err := b.js.Consumer(ctx, events.StreamHotel, "pair")
	require.NoError(t, err)
	ci := c.CachedInfo()
	require.Equal(t, jetstream.DeliverAllPolicy, ci.Config.DeliverPolicy)
	require.GreaterOrEqual(t, lostCount(t, reg, "pair"), 2.0, "each replacement is counted")
}

// TestInboxPurgeAndAgingAreNotANewStream: messages removed from the
// stream's start (what limits retention does to old ones) and a full purge
// keep the sequences going, so the position stays true: a consumer lost
// after them is made again from the position, not from the start, and
// nothing is counted as a replaced stream.
func TestInboxPurgeAndAgingAreNotANewStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	effect, effects := effectsTable(t, b)
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	require.NoError(t, err)
	in, err := New(Config{
		Name: "purge", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
		Types: []string{events.HotelHeld}, Pool: b.pool, JetStream: b.js, Handler: effect,
		Metrics: metrics, WatchInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	stop := startInbox(t, in)
	s, err := b.js.Stream(ctx, events.StreamHotel)
	require.NoError(t, err)
	publishN(t, b.js, "a", 10)
	testenv.Eventually(t, func() bool { return storedFloor(t, b, "purge") == 10 }, "position 10")
	require.NoError(t, s.Purge(ctx, jetstream.WithPurgeSequence(6))) // #1..#5 aged out
	publishN(t, b.js, "b", 5)
	testenv.Eventually(t, func() bool { return storedFloor(t, b, "purge") == 15 }, "position 15")
	require.NoError(t, s.Purge(ctx)) // all of it
	publishN(t, b.js, "c", 5)
	testenv.Eventually(t, func() bool { return storedFloor(t, b, "purge") == 20 }, "position 20")
	stop()

	require.NoError(t, s.Purge(ctx))
	require.NoError(t, b.js.DeleteConsumer(ctx, events.StreamHotel, "purge"))
	publishN(t, b.js, "d", 5)
	seq, err := in.StartSeq(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(21), seq, "after a purge the position still counts")
	startInbox(t, in)
	testenv.Eventually(t, func() bool { _, d := effects(); return d == 25 }, "every event has its effect")
	c, err := b.js.Consumer(ctx, events.StreamHotel, "purge")
	require.NoError(t, err)
	require.Equal(t, uint64(21), c.CachedInfo().Config.OptStartSeq, "made again from the position")
	rows, _ := effects()
	require.Equal(t, 25, rows, "none handled twice")
	require.Zero(t, lostReason(t, reg, "purge", LostStreamReplaced), "neither is a new stream")
}

// TestInboxEmptyStoreSwappedIn: the NATS server is stopped and started
// again on the same port with an empty store (a lost disk, a wrong volume);
// the stream's owner makes its stream again and events go into it from
// sequence 1 while the inbox runs on. The inbox sees another stream and
// reads it from its start: every event before and after has one effect.
func TestInboxEmptyStoreSwappedIn(t *testing.T) {
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
		Name: "swap", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
		Types: []string{events.HotelHeld}, Pool: pool, JetStream: js, Handler: effect,
		Metrics: metrics, WatchInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	startInbox(t, in)
	publishN(t, js, "a", 8)
	testenv.Eventually(t, func() bool { return storedFloor(t, b, "swap") == 8 }, "position 8")

	srv.Shutdown()
	srv.WaitForShutdown()
	opts2 := opts.Clone()
	opts2.StoreDir = t.TempDir() // empty
	srv2, err := server.NewServer(opts2)
	require.NoError(t, err)
	go srv2.Start()
	t.Cleanup(func() { srv2.Shutdown(); srv2.WaitForShutdown() })
	require.True(t, srv2.ReadyForConnections(10*time.Second))
	testenv.Eventually(t, nc.IsConnected, "the client reconnects")
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	publishN(t, js, "b", 6) // #1..#6, below the old position
	testenv.Eventually(t, func() bool { _, d := effects(); return d == 14 }, "the events of the new store are handled")
	rows, _ := effects()
	require.Equal(t, 14, rows, "none handled twice")
	testenv.Eventually(t, func() bool { return in.Check(ctx) == nil }, "the inbox is ready")
	require.Positive(t, lostCount(t, reg, "swap"), "the loss is counted")
}

// TestInboxJudgeStream: which streams are another one than the position
// counts on, from the stream's info and the inbox_position row.
func TestInboxJudgeStream(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 11, 30, 14, 0, 0, 123456789, time.UTC)
	rec := created.Truncate(time.Microsecond)
	other := created.Add(time.Hour)
	st := func(c time.Time, first, last uint64) *jetstream.StreamInfo {
		return &jetstream.StreamInfo{Created: c, State: jetstream.StreamState{FirstSeq: first, LastSeq: last}}
	}
	row := func(floor, first, last int64, c *time.Time) streamRow {
		return dbsqlc.InboxStreamLockRow{AckFloor: floor, FirstSeq: first, LastSeq: last, StreamCreated: c}
	}
	for _, tc := range []struct {
		name    string
		st      *jetstream.StreamInfo
		row     streamRow
		pos     uint64
		another bool
	}{
		{"same stream, grown", st(created, 1, 50), row(40, 1, 45, &rec), 40, false},
		{"nothing recorded", st(created, 1, 50), row(0, 0, 0, nil), 0, false},
		{"legacy row, stream past the floor", st(created, 1, 50), row(40, 0, 0, nil), 40, false},
		{"purged: first past the floor", st(created, 51, 50), row(40, 1, 45, &rec), 40, false},
		{"aged out: first moved", st(created, 30, 50), row(40, 1, 45, &rec), 40, false},
		{"deleted and made again", st(other, 1, 50), row(40, 1, 45, &rec), 0, true},
		{"made again, fewer messages", st(other, 1, 6), row(4, 1, 5, &rec), 0, true},
		{"restored from an older store", st(created, 1, 42), row(40, 1, 45, &rec), 0, true},
		{"legacy row, stream ends before the floor", st(created, 1, 30), row(40, 0, 0, nil), 0, true},
	} {
		in := &Inbox{cfg: Config{Name: "judge", Stream: events.StreamHotel}}
		pos, why := in.judge(tc.st, tc.row)
		require.Equal(t, tc.pos, pos, tc.name)
		require.Equal(t, tc.another, why != "", "%s: %s", tc.name, why)
	}
}
