package outbox

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

// verifyWindow is the HOTEL stream's duplicate window in these tests, so
// that what waits for it waits seconds, not the two minutes of
// events.DuplicateWindow. It is set before anything is published: the
// server's dedup timer starts with the first stored id.
const verifyWindow = 2 * time.Second

func setupVerify(t *testing.T) (*bundle, *Relay, jetstream.Stream) {
	t.Helper()
	b := setup(t)
	ctx := context.Background()
	s, err := b.js.Stream(ctx, events.StreamHotel)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	cfg.Duplicates = verifyWindow
	s, err = b.js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, VerifyInterval: -1})
	require.NoError(t, err)
	return b, r, s
}

// publish writes n events and has the relay publish them.
func publishEventsN(t *testing.T, b *bundle, r *Relay, n int) []event.Event {
	t.Helper()
	var evs []event.Event
	for i := range n {
		evs = append(evs, newEvent(t, "T-"+strconv.Itoa(i)))
	}
	writeEvents(t, b, evs...)
	drain(t, r)
	return evs
}

func ids(evs []event.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.ID())
	}
	return out
}

// verifyAll is a pass of the CLI's kind: the gap check and every row read back.
func verifyAll(t *testing.T, b *bundle) VerifyReport {
	t.Helper()
	rep, err := Verify(context.Background(), b.pool, b.js, VerifyOptions{ReadBack: -1})
	require.NoError(t, err)
	return rep
}

func lostIDs(rep VerifyReport) []string {
	var out []string
	for _, l := range rep.Lost {
		out = append(out, l.EventID)
	}
	slices.Sort(out)
	return out
}

// republished waits until the relay has published again what was lost:
// drains until the stream holds want (in any order), each once.
func republished(t *testing.T, b *bundle, r *Relay, want []string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	testenv.Eventually(t, func() bool {
		drain(t, r)
		// As the relay's own pass would, should the server still have
		// remembered an id (it forgets them on a timer).
		_, err := Verify(context.Background(), b.pool, b.js, VerifyOptions{})
		require.NoError(t, err)
		drain(t, r)
		got := storedIDs(t, b)
		slices.Sort(got)
		return slices.Equal(got, want)
	}, "the stream holds %v once each", want)
}

func TestVerify(t *testing.T) {
	t.Parallel()

	t.Run("RecordsWhereEachPubAckSaysAndFindsNothingLost", func(t *testing.T) {
		t.Parallel()
		b, r, s := setupVerify(t)
		evs := publishEventsN(t, b, r, 3)
		ctx := context.Background()
		rows, err := b.pool.Query(ctx, "SELECT event_id, stream, stream_seq FROM outbox ORDER BY id")
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var id, stream string
			var seq int64
			require.NoError(t, rows.Scan(&id, &stream, &seq))
			require.Equal(t, events.StreamHotel, stream)
			m, err := s.GetMsg(ctx, uint64(seq))
			require.NoError(t, err)
			require.Equal(t, id, m.Header.Get(jetstream.MsgIDHeader), "the message at the recorded sequence")
		}
		require.NoError(t, rows.Err())
		rep := verifyAll(t, b)
		require.Empty(t, rep.Lost)
		require.Equal(t, 3, rep.ReadBack)
		var unverified int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE verified_at IS NULL").Scan(&unverified))
		require.Zero(t, unverified)
		require.Equal(t, ids(evs), streamIDs(t, b))
	})

	t.Run("APacedPassEndedByItsContextJudgesNothing", func(t *testing.T) {
		t.Parallel()
		b, r, _ := setupVerify(t)
		publishEventsN(t, b, r, verifyChunk+1)
		// Two chunks over an hour: the second is due 30 min after the
		// first, long after the context ends.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		rep, err := Verify(ctx, b.pool, b.js, VerifyOptions{ReadBack: -1, Spread: time.Hour})
		require.Error(t, err, "rows left unjudged are an error")
		require.Empty(t, rep.Lost, "a read that could not be made calls nothing lost")
		var verified, waiting int
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FILTER (WHERE verified_at IS NOT NULL), count(*) FILTER (WHERE published_at IS NULL) FROM outbox").Scan(&verified, &waiting))
		require.Zero(t, verified, "nothing is marked verified by a pass that did not end")
		require.Zero(t, waiting, "nothing is put back in line")
		rep = verifyAll(t, b) // the next pass, unpaced, judges them all
		require.Empty(t, rep.Lost)
		require.Equal(t, verifyChunk+1, rep.ReadBack)
	})

	t.Run("ADeletedMessageIsPublishedAgainOnceTheDuplicateWindowHasPassed", func(t *testing.T) {
		t.Parallel()
		b, r, s := setupVerify(t)
		evs := publishEventsN(t, b, r, 3)
		ctx := context.Background()
		gone := evs[1]
		require.NoError(t, s.DeleteMsg(ctx, 2))
		// What the server does with a re-publish inside the window: it
		// still remembers the id, answers "duplicate" with the sequence
		// that no longer holds it, and stores nothing. So the verify
		// waits the window out.
		ack, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: "hotel.held.T-1", Data: []byte("{}")}, jetstream.WithMsgID(gone.ID()))
		require.NoError(t, err)
		require.True(t, ack.Duplicate, "a re-publish inside the window is taken for a duplicate")
		require.Equal(t, uint64(2), ack.Sequence)
		_, err = s.GetMsg(ctx, 2)
		require.ErrorIs(t, err, jetstream.ErrMsgNotFound)

		rep, err := Verify(ctx, b.pool, b.js, VerifyOptions{}) // the gap check alone finds it
		require.NoError(t, err)
		require.Equal(t, []string{gone.ID()}, lostIDs(rep))
		require.Equal(t, "not found", rep.Lost[0].Why)
		require.Equal(t, uint64(2), rep.Lost[0].Seq)
		ws, err := WaitingByCause(ctx, b.pool)
		require.NoError(t, err)
		require.Len(t, ws, 1)
		require.Equal(t, CauseLost, ws[0].Cause)
		d, err := Details(ctx, b.pool)
		require.NoError(t, err)
		require.Len(t, d, 2, "%q", d)
		require.Contains(t, d[0], "1 events waiting: lost")
		require.Contains(t, d[1], "1 published events were found lost by their stream")
		require.Contains(t, d[1], gone.ID())
		// A second pass finds nothing more: the row waits.
		require.Empty(t, verifyAll(t, b).Lost)

		republished(t, b, r, ids(evs))
		require.Empty(t, verifyAll(t, b).Lost, "published again, it is where its new PubAck says")
		d, err = Details(ctx, b.pool)
		require.NoError(t, err)
		require.Len(t, d, 1, "%q", d)
		require.Contains(t, d[0], "0 of them not published again yet")
	})

	t.Run("APurgedStreamIsPublishedAgain", func(t *testing.T) {
		t.Parallel()
		b, r, s := setupVerify(t)
		evs := publishEventsN(t, b, r, 3)
		ctx := context.Background()
		require.NoError(t, s.Purge(ctx))
		rep := verifyAll(t, b)
		require.Equal(t, slices.Sorted(slices.Values(ids(evs))), lostIDs(rep))
		republished(t, b, r, ids(evs))
		require.Empty(t, verifyAll(t, b).Lost)
	})

	t.Run("ASequenceThatHoldsAnotherEventIsFoundByTheReadBack", func(t *testing.T) {
		t.Parallel()
		// A stream restored from an older snapshot and written to since:
		// the sequences are there, with other events.
		b, r, _ := setupVerify(t)
		evs := publishEventsN(t, b, r, 2)
		ctx := context.Background()
		require.NoError(t, b.js.DeleteStream(ctx, events.StreamHotel))
		require.NoError(t, events.EnsureStreams(ctx, b.js, events.Selected()))
		s, err := b.js.Stream(ctx, events.StreamHotel)
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		cfg.Duplicates = verifyWindow
		_, err = b.js.UpdateStream(ctx, cfg)
		require.NoError(t, err)
		others := []string{}
		for _, trip := range []string{"T-x", "T-y"} {
			e := newEvent(t, trip)
			others = append(others, e.ID())
			h, err := events.EncodeHeaders(e)
			require.NoError(t, err)
			m := &nats.Msg{Subject: "hotel.held." + trip, Data: e.Data(), Header: nats.Header{}}
			for k, v := range h {
				m.Header.Set(k, v)
			}
			_, err = b.js.PublishMsg(ctx, m, jetstream.WithMsgID(e.ID()))
			require.NoError(t, err)
		}
		rep, err := Verify(ctx, b.pool, b.js, VerifyOptions{})
		require.NoError(t, err)
		require.Empty(t, rep.Lost, "the gap check sees sequences 1 and 2 there")
		rep = verifyAll(t, b)
		require.Equal(t, slices.Sorted(slices.Values(ids(evs))), lostIDs(rep))
		require.Equal(t, "another event", rep.Lost[0].Why)
		republished(t, b, r, append(others, ids(evs)...))
	})

	t.Run("ADeletedStreamIsPublishedAgain", func(t *testing.T) {
		t.Parallel()
		b, r, _ := setupVerify(t)
		evs := publishEventsN(t, b, r, 2)
		ctx := context.Background()
		require.NoError(t, b.js.DeleteStream(ctx, events.StreamHotel))
		rep := verifyAll(t, b)
		require.Equal(t, slices.Sorted(slices.Values(ids(evs))), lostIDs(rep))
		require.Equal(t, "no stream", rep.Lost[0].Why)
		// A new stream has a new dedup map: due after the default window
		// counted from the first publish; the test moves the row's due
		// time instead of waiting two minutes.
		_, err := b.pool.Exec(ctx, "UPDATE outbox SET next_attempt_at = now() WHERE published_at IS NULL")
		require.NoError(t, err)
		require.NoError(t, events.EnsureStreams(ctx, b.js, events.Selected()))
		republished(t, b, r, ids(evs))
	})

	t.Run("TheRelayRunsItByItself", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s, err := b.js.Stream(ctx, events.StreamHotel)
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		cfg.Duplicates = verifyWindow
		_, err = b.js.UpdateStream(ctx, cfg)
		require.NoError(t, err)
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, VerifyInterval: 50 * time.Millisecond, PollInterval: 50 * time.Millisecond})
		require.NoError(t, err)
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(ctx) }()
		defer func() { cancel(); <-done }()
		e := newEvent(t, "T-run")
		writeEvents(t, b, e)
		testenv.Eventually(t, func() bool { return slices.Equal(streamIDs(t, b), []string{e.ID()}) }, "published")
		testenv.Eventually(t, func() bool {
			var n int
			_ = b.pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE stream_seq IS NOT NULL").Scan(&n)
			return n == 1
		}, "marked with its sequence")
		require.NoError(t, s.DeleteMsg(ctx, 1))
		testenv.Eventually(t, func() bool { return slices.Equal(storedIDs(t, b), []string{e.ID()}) }, "published again")
		require.GreaterOrEqual(t, counterValue(t, r.m.lost.WithLabelValues(events.StreamHotel)), 1.0, "counted")
	})
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// storedIDs returns the ce-id of every message HOTEL holds, in stream
// order, skipping deleted sequences.
func storedIDs(t *testing.T, b *bundle) []string {
	ctx := context.Background()
	s, err := b.js.Stream(ctx, events.StreamHotel)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	ids := []string{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		require.NoError(t, err)
		ids = append(ids, m.Header.Get("ce-id"))
	}
	return ids
}

// TestPaceAt: the gap check's suspects are read at once, the routine rows
// in chunks of verifyChunk evenly over the spread, the first chunk at once.
func TestPaceAt(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 3, 16, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		i, suspects, n int
		spread         time.Duration
		want           time.Duration
	}{
		{i: 0, suspects: 0, n: 400, spread: 4 * time.Second, want: 0},
		{i: 99, suspects: 0, n: 400, spread: 4 * time.Second, want: 0},
		{i: 100, suspects: 0, n: 400, spread: 4 * time.Second, want: time.Second},
		{i: 399, suspects: 0, n: 400, spread: 4 * time.Second, want: 3 * time.Second},
		{i: 1, suspects: 2, n: 402, spread: 4 * time.Second, want: 0},                 // a suspect
		{i: 2, suspects: 2, n: 402, spread: 4 * time.Second, want: 0},                 // the first routine row
		{i: 401, suspects: 2, n: 402, spread: 4 * time.Second, want: 3 * time.Second}, // the last chunk of four
		{i: 399, suspects: 0, n: 400, spread: 0, want: 0},                             // unpaced
		{i: 99, suspects: 0, n: 100, spread: time.Hour, want: 0},                      // one chunk
		{i: 100, suspects: 0, n: 101, spread: time.Hour, want: 30 * time.Minute},      // two chunks
	} {
		require.Equal(t, start.Add(c.want), paceAt(start, c.i, c.suspects, c.n, c.spread), "%+v", c)
	}
}
