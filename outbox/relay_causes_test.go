package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// rowState is an outbox row as the tests look at it.
type rowState struct {
	published, quarantined bool
	attempts, outages      int
	cause                  string
}

func rowOf(t *testing.T, b *bundle, eventID string) rowState {
	t.Helper()
	var s rowState
	var cause *string
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT published_at IS NOT NULL, quarantined_at IS NOT NULL, attempts, outages, last_cause FROM outbox WHERE event_id = $1`, eventID).
		Scan(&s.published, &s.quarantined, &s.attempts, &s.outages, &cause))
	if cause != nil {
		s.cause = *cause
	}
	return s
}

// countStream returns how many messages stream holds and how many distinct
// ce-id values they carry.
func countStream(t *testing.T, js jetstream.JetStream, stream string) (msgs, distinct int) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	seen := map[string]bool{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		seen[m.Header.Get("ce-id")] = true
	}
	return int(info.State.Msgs), len(seen)
}

// batches runs PublishBatch n times, waiting for rows to become due in
// between, and returns the outage errors seen.
func batches(t *testing.T, r *Relay, n int) []error {
	t.Helper()
	var outages []error
	for range n {
		_, err := r.PublishBatch(context.Background())
		var oe *OutageError
		if err != nil {
			require.ErrorAs(t, err, &oe, "only outages are reported; the batch itself works")
			outages = append(outages, err)
		}
		time.Sleep(60 * time.Millisecond)
	}
	return outages
}

// oddEvent is a well-formed event of a type no stream of the catalogue
// holds (subject "hotel2.held.<trip>"); outbox.Write refuses it, so tests
// insert it as a row directly, as a stream deleted at runtime would leave
// one.
func oddEvent(t *testing.T, trip string) event.Event {
	e := event.New()
	e.SetID("odd-" + trip)
	e.SetSource("/tripsaga/hotel")
	e.SetType("io.tripsaga.hotel2.held.v1")
	e.SetSubject(trip)
	require.NoError(t, e.SetData(event.ApplicationJSON, map[string]string{"trip_id": trip}))
	return e
}

func insertRaw(t *testing.T, b *bundle, e event.Event) {
	t.Helper()
	subject, err := events.Subject(e.Type(), e.Subject())
	require.NoError(t, err)
	h, err := events.EncodeHeaders(e)
	require.NoError(t, err)
	hj, err := json.Marshal(h)
	require.NoError(t, err)
	_, err = b.pool.Exec(context.Background(), `INSERT INTO outbox (event_id, nats_subject, headers, data) VALUES ($1, $2, $3, $4)`,
		e.ID(), subject, hj, e.Data())
	require.NoError(t, err)
}

func TestWriteRefusesASubjectNoStreamHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	err = Write(ctx, tx, oddEvent(t, "T-odd"))
	require.ErrorIs(t, err, events.ErrInvalidEvent)
	require.ErrorContains(t, err, `no stream of the catalogue holds subject "hotel2.held.T-odd"`)
}

func TestRelayCauses(t *testing.T) {
	t.Parallel()

	t.Run("ARowNoStreamHoldsBlocksNothingAndIsPublishedOnceAStreamHoldsIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		odd := oddEvent(t, "T-odd")
		insertRaw(t, b, odd) // first in line
		var good []event.Event
		for i := range 250 {
			good = append(good, newEvent(t, fmt.Sprintf("T-%d", i)))
		}
		writeEvents(t, b, good...)
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, BackoffMax: 100 * time.Millisecond, MaxAttempts: 2})
		require.NoError(t, err)

		outages := batches(t, r, 8)
		require.NotEmpty(t, outages)
		var oe *OutageError
		require.ErrorAs(t, outages[0], &oe)
		require.Equal(t, CauseNoStream, oe.Cause)

		for _, e := range good {
			require.True(t, rowOf(t, b, e.ID()).published, "every acked row is marked, whatever happened to the odd one")
		}
		msgs, distinct := countStream(t, b.js, events.StreamHotel)
		require.Equal(t, 250, msgs, "no acked row is re-published")
		require.Equal(t, 250, distinct)
		st := rowOf(t, b, odd.ID())
		require.False(t, st.published)
		require.False(t, st.quarantined, "no stream for the subject is an outage, never a reason to quarantine")
		require.Zero(t, st.attempts)
		require.GreaterOrEqual(t, st.outages, 2, "retried with backoff")
		require.Equal(t, string(CauseNoStream), st.cause)

		details, err := Details(context.Background(), b.pool)
		require.NoError(t, err)
		require.Len(t, details, 1)
		require.Contains(t, details[0], "1 events waiting: no_stream (outage)")

		// An operator adds a stream for the subject: the row is published once.
		_, err = b.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "HOTEL2", Subjects: []string{"hotel2.>"}, Duplicates: events.DuplicateWindow})
		require.NoError(t, err)
		testenv.Eventually(t, func() bool {
			_, _ = r.PublishBatch(context.Background())
			return rowOf(t, b, odd.ID()).published
		}, "the odd row is published once a stream holds its subject")
		msgs, _ = countStream(t, b.js, "HOTEL2")
		require.Equal(t, 1, msgs)
		msgs, _ = countStream(t, b.js, events.StreamHotel)
		require.Equal(t, 250, msgs)
		details, err = Details(context.Background(), b.pool)
		require.NoError(t, err)
		require.Empty(t, details)
	})

	t.Run("AStreamDeletedAtRuntimeIsCreatedAgainAndItsEventsGoOut", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		require.NoError(t, b.js.DeleteStream(ctx, events.StreamHotel))
		var good []event.Event
		for i := range 20 {
			good = append(good, newEvent(t, fmt.Sprintf("T-%d", i)))
		}
		writeEvents(t, b, good...)
		r, err := NewRelay(RelayConfig{
			Pool: b.pool, JetStream: b.js, BackoffMax: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond,
			EnsureStreams: func(ctx context.Context) error { return events.EnsureStreams(ctx, b.js, events.Default) },
		})
		require.NoError(t, err)
		go func() { _ = r.Run(ctx) }()
		testenv.Eventually(t, func() bool {
			n, err := Pending(context.Background(), b.pool)
			return err == nil && n == 0
		}, "every event is published once the stream is back")
		msgs, distinct := countStream(t, b.js, events.StreamHotel)
		require.Equal(t, 20, msgs)
		require.Equal(t, 20, distinct)
	})

	t.Run("AFullDiskIsAnOutageAndEverythingIsPublishedOnceWhenSpaceReturns", func(t *testing.T) {
		t.Parallel()
		pool, _ := testenv.SchemaPool(t, "svc", tripsql.SetSaga)
		srv, opts := testenv.NATSWith(t, func(o *server.Options) { o.JetStreamMaxStore = 64 << 10 })
		nc := testenv.Connect(t, srv, natsauth.Admin)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		require.NoError(t, events.EnsureStreams(context.Background(), js, events.Default))
		b := &bundle{pool: pool, js: js, nc: nc, srv: srv}

		pad := strings.Repeat("x", 1000)
		var all []event.Event
		for i := range 300 { // about 400 kB: far more than 64 kB of storage
			e, err := events.New(events.Source("hotel"), events.HotelHeld, fmt.Sprintf("T-%d", i), events.StepData{TripID: fmt.Sprintf("T-%d", i), Step: "hotel", Reason: pad})
			require.NoError(t, err)
			all = append(all, e)
		}
		writeEvents(t, b, all...)
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, BackoffMax: 100 * time.Millisecond, MaxAttempts: 2})
		require.NoError(t, err)

		outages := batches(t, r, 10)
		require.NotEmpty(t, outages, "the server refuses for lack of storage")
		var oe *OutageError
		require.ErrorAs(t, outages[len(outages)-1], &oe)
		require.Equal(t, CauseStorage, oe.Cause, "%v", outages[len(outages)-1])
		var quarantined, refusals, waiting int
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT count(*) FILTER (WHERE quarantined_at IS NOT NULL), coalesce(sum(attempts), 0), count(*) FILTER (WHERE published_at IS NULL) FROM outbox`).
			Scan(&quarantined, &refusals, &waiting))
		require.Zero(t, quarantined, "a full disk never quarantines good events")
		require.Zero(t, refusals, "a full disk is not counted against the events")
		require.Positive(t, waiting, "some events wait for space")
		details, err := Details(context.Background(), b.pool)
		require.NoError(t, err)
		require.NotEmpty(t, details)
		require.Contains(t, details[0], "storage (outage)")

		// Space returns: the limit is raised on the running server.
		more := opts.Clone()
		more.JetStreamMaxStore = 64 << 20
		require.NoError(t, srv.ReloadOptions(more))
		testenv.Eventually(t, func() bool {
			if _, err := r.PublishBatch(context.Background()); err != nil {
				t.Logf("after reload: %v", err)
			}
			n, err := Pending(context.Background(), b.pool)
			return err == nil && n == 0
		}, "every event is published once space returns")
		msgs, distinct := countStream(t, b.js, events.StreamHotel)
		require.Equal(t, 300, msgs, "each event stored once")
		require.Equal(t, 300, distinct)
	})

	t.Run("ARefusedEventIsQuarantinedWithItsReasonAndRedrivenOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		s, err := b.js.Stream(ctx, events.StreamHotel)
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		cfg.MaxMsgSize = 2048
		_, err = b.js.UpdateStream(ctx, cfg)
		require.NoError(t, err)

		big, err := events.New(events.Source("hotel"), events.HotelHeld, "T-big", events.StepData{TripID: "T-big", Step: "hotel", Reason: strings.Repeat("y", 4096)})
		require.NoError(t, err)
		small := newEvent(t, "T-small")
		writeEvents(t, b, big, small)
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, BackoffMax: 50 * time.Millisecond, MaxAttempts: 3})
		require.NoError(t, err)
		testenv.Eventually(t, func() bool {
			_, err := r.PublishBatch(ctx)
			require.NoError(t, err, "a refusal is not an outage")
			return rowOf(t, b, big.ID()).quarantined
		}, "the refused event is quarantined")
		st := rowOf(t, b, big.ID())
		require.Equal(t, 3, st.attempts)
		require.Equal(t, string(CauseRefused), st.cause)
		require.True(t, rowOf(t, b, small.ID()).published)

		rows, err := List(ctx, b.pool, false, 100)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.Equal(t, big.ID(), rows[0].EventID)
		require.True(t, rows[0].Quarantined)
		require.Contains(t, rows[0].LastError, "message size exceeds maximum allowed")

		// Re-driving before the cause is fixed quarantines it again;
		// once the limit is raised, a re-drive publishes it once.
		cfg.MaxMsgSize = -1
		_, err = b.js.UpdateStream(ctx, cfg)
		require.NoError(t, err)
		ids, err := Redrive(ctx, b.pool, []string{big.ID(), "not-quarantined"})
		require.NoError(t, err)
		require.Equal(t, []string{big.ID()}, ids)
		drain(t, r)
		require.True(t, rowOf(t, b, big.ID()).published)
		ids, err = Redrive(ctx, b.pool, nil)
		require.NoError(t, err)
		require.Empty(t, ids, "a published row is not re-driven")
		drain(t, r)
		msgs, distinct := countStream(t, b.js, events.StreamHotel)
		require.Equal(t, 2, msgs)
		require.Equal(t, 2, distinct)
	})
}

func TestClassify(t *testing.T) {
	api := func(code int, errCode jetstream.ErrorCode) error {
		return fmt.Errorf("publish: %w", &jetstream.APIError{Code: code, ErrorCode: errCode, Description: "x"})
	}
	for _, tc := range []struct {
		err  error
		want Cause
	}{
		{api(400, 10054), CauseRefused},
		{api(400, 10097), CauseRefused},
		{api(503, 10023), CauseStorage},
		{api(500, 10047), CauseStorage},
		{api(503, 10077), CauseStorage},
		{api(500, 10053), CauseLimits},
		{api(404, 10059), CauseNoStream},
		{api(500, 10009), CauseNoLeader},
		{api(400, 12345), CauseServer},
		{jetstream.ErrNoStreamResponse, CauseNoStream},
		{jetstream.ErrAsyncPublishTimeout, CauseTimeout},
		{errNoPubAck, CauseTimeout},
		{nats.ErrConnectionClosed, CauseDisconnected},
		{nats.ErrMaxPayload, CauseRefused},
		{fmt.Errorf("%w: headers", errBadRow), CauseRefused},
		{errors.New("something new"), CauseServer},
	} {
		require.Equal(t, tc.want, Classify(tc.err), "%v", tc.err)
	}
}
