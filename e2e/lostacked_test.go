package e2e

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/natsauth"
)

// lostWindow is the duplicate window of HOTEL and PAYMENT in this test,
// set before any trip is booked, so that an event lost mid-trip is
// published again within seconds instead of after the two minutes of
// events.DuplicateWindow (the verify waits the stream's window out).
const lostWindow = 3 * time.Second

// TestAcknowledgedEventsTheStreamLost (issue 17 item 2): a published,
// acknowledged event is deleted from its stream before its consumer got
// it, and a whole stream is purged, mid-trip: each service's relay finds
// what its stream lost, publishes it again with the same Nats-Msg-Id,
// counts and logs it; every trip ends whole, with one charge line and one
// mail (the consumers' inboxes drop the copies of what they had handled).
func TestAcknowledgedEventsTheStreamLost(t *testing.T) {
	// Its own stack: it runs beside the other tests that have one.
	t.Parallel()
	require.NotEmpty(t, bin, "TestMain builds the binary")
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o711))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := stack.Start(ctx, stack.Config{Dir: filepath.Join(dir, "stack"), Binary: bin})
	require.NoError(t, err)
	defer s.Stop()
	g := &faultRig{
		s: s, nonce: strconv.FormatInt(time.Now().UnixNano()%1e9, 36), http: &http.Client{Timeout: 60 * time.Second},
		armed: map[string]string{}, scenario: map[string]string{}, card: map[string]string{},
	}
	nc, err := s.ConnectNATS(natsauth.Admin)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	bg := context.Background()
	for _, name := range []string{events.StreamHotel, events.StreamPayment} {
		st, err := js.Stream(bg, name)
		require.NoError(t, err)
		cfg := st.CachedInfo().Config
		cfg.Duplicates = lostWindow
		_, err = js.UpdateStream(bg, cfg)
		require.NoError(t, err)
	}

	// Trips before the faults: their PAYMENT events go with the purge.
	var ids []string
	for i := range 3 {
		ids = append(ids, g.book(t, "before"+strconv.Itoa(i), happy))
	}
	for _, id := range ids {
		require.Equal(t, demo.Whole, g.judge(t, id).Verdict)
	}

	// lose books a trip while consumer durable of stream is paused, so
	// the trip's event subject stays undelivered to it; then loses it
	// from the stream (drop) and resumes the consumer.
	lose := func(tag, stream, durable, kind string, drop func(jetstream.Stream, uint64)) string {
		_, err := js.PauseConsumer(bg, stream, durable, time.Now().Add(time.Hour))
		require.NoError(t, err)
		id := g.book(t, tag, happy)
		st, err := js.Stream(bg, stream)
		require.NoError(t, err)
		var seq uint64
		wait(t, 60*time.Second, func() bool {
			m, err := st.GetLastMsgForSubject(bg, kind+"."+id)
			if err == nil {
				seq = m.Sequence
			}
			return err == nil
		}, "%s of trip %s is published", kind, id)
		drop(st, seq)
		_, err = js.ResumeConsumer(bg, stream, durable)
		require.NoError(t, err)
		return id
	}
	deleted := lose("deleted", events.StreamHotel, "payment", "hotel.held", func(st jetstream.Stream, seq uint64) {
		require.NoError(t, st.DeleteMsg(bg, seq))
	})
	purged := lose("purged", events.StreamPayment, "car", "payment.charged", func(st jetstream.Stream, _ uint64) {
		require.NoError(t, st.Purge(bg))
	})
	ids = append(ids, deleted, purged)

	for _, id := range ids {
		o := g.judge(t, id)
		b := o.summary()
		require.Equal(t, demo.Whole, o.Verdict, "trip %s: %s", id, b)
		require.Equal(t, 1, o.Charges, "one charge line: %s", b)
		require.Zero(t, o.Refunds, b)
		require.Equal(t, 1, o.Mails, "one mail: %s", b)
	}
	for _, svc := range []string{"hotel", "payment"} {
		require.GreaterOrEqual(t, lostCount(t, s, svc), 1.0, "%s counts what its stream lost", svc)
		b, err := os.ReadFile(s.LogPath(svc))
		require.NoError(t, err)
		require.Contains(t, string(b), `level=ERROR msg="outbox verify: a published event is no longer in its stream`, svc)
	}
	// Still one mail each once everything lost has been published again
	// (and handled, or dropped, by every consumer).
	for _, svc := range []string{"hotel", "payment"} {
		wait(t, 60*time.Second, func() bool { return outboxLostWaiting(t, s, svc) == 0 }, "%s has published again all it lost", svc)
	}
	for _, id := range ids {
		o := g.judge(t, id)
		require.Equal(t, 1, o.Mails, "one mail: %s", o.summary())
		require.Equal(t, 1, o.Charges, "one charge line: %s", o.summary())
	}
}

// lostCount sums tripsaga_outbox_lost_total on a process's /metrics.
func lostCount(t *testing.T, s *stack.Stack, process string) float64 {
	t.Helper()
	resp, err := http.Get(s.URL(process) + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	n := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "tripsaga_outbox_lost_total{") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		require.NoError(t, err, line)
		n += v
	}
	require.NoError(t, sc.Err())
	return n
}

// outboxLostWaiting is -1 while the process's /readyz names events lost
// and not published again yet, 0 once it names none waiting.
func outboxLostWaiting(t *testing.T, s *stack.Stack, process string) int {
	t.Helper()
	resp, err := http.Get(s.URL(process) + "/readyz")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "events waiting: lost") {
			return -1
		}
	}
	return 0
}
