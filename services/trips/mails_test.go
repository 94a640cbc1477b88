package trips

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/sim"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// mailRig is two trips replicas (Service.Run, relay, inboxes, runners and
// the notice pass each) on one real PostgreSQL schema and JetStream, and
// the mail relay simulator.
type mailRig struct {
	pool    *pgxpool.Pool
	js      jetstream.JetStream
	mailURL string
	a, b    *Service
}

var mailTiming = saga.Timing{
	CallTimeout: 500 * time.Millisecond, StepDeadline: 2 * time.Second,
	RetryBackoffMin: 20 * time.Millisecond, RetryBackoffMax: 200 * time.Millisecond,
	UndoBackoffMin: 20 * time.Millisecond, UndoBackoffMax: 200 * time.Millisecond,
	IncidentAfter: 3, PollInterval: 50 * time.Millisecond,
}

func newMailRig(t *testing.T, noticeAfter time.Duration) *mailRig {
	t.Helper()
	ctx := context.Background()
	pool, dbURL := testenv.SchemaPool(t, "trips", tripsql.SetSaga, tripsql.SetTrips)
	sims, err := sim.New(ctx, sim.Config{DatabaseURL: dbURL})
	require.NoError(t, err)
	srv := httptest.NewServer(sims.Handler())
	t.Cleanup(func() { srv.Close(); sims.Close() })
	_, _, js := testenv.JetStream(t)
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	g := &mailRig{pool: pool, js: js, mailURL: srv.URL + "/mail"}
	start := func(instance string) *Service {
		// A pool of its own, as a process has, sized as the process's
		// (the test pool's default of 4 is less than a service holds).
		cfg := pool.Config().Copy()
		cfg.MaxConns = 16
		own, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(own.Close)
		s, err := New(Config{Pool: own, JetStream: js, MailURL: g.mailURL, Timing: mailTiming, Instance: instance, NoticeAfter: noticeAfter})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = s.Run(rctx, nil); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		return s
	}
	g.a, g.b = start("trips-a"), start("trips-b")
	return g
}

// book records a trip as POST /trips does.
func (g *mailRig) book(t *testing.T, key string) string {
	t.Helper()
	var req events.TripRequest
	require.NoError(t, json.Unmarshal([]byte(tripJSON(t, nil)), &req))
	row, err := g.a.create(context.Background(), key, req)
	require.NoError(t, err)
	return row.TripID
}

// publish stores the event e on its subject, as its service's relay does.
func (g *mailRig) publish(t *testing.T, e event.Event) {
	t.Helper()
	h, err := events.EncodeHeaders(e)
	require.NoError(t, err)
	subject, err := events.Subject(e.Type(), e.Subject())
	require.NoError(t, err)
	m := &nats.Msg{Subject: subject, Data: e.Data(), Header: nats.Header{}}
	for k, v := range h {
		m.Header.Set(k, v)
	}
	m.Header.Set(jetstream.MsgIDHeader, e.ID())
	_, err = g.js.PublishMsg(context.Background(), m)
	require.NoError(t, err)
}

func (g *mailRig) step(t *testing.T, trip string, types ...string) {
	t.Helper()
	for _, typ := range types {
		src := map[string]string{"hotel": "hotel", "payment": "payment", "car": "car"}[strings.SplitN(events.Kind(typ), ".", 2)[0]]
		e, err := events.New(events.Source(src), typ, trip, events.StepData{TripID: trip})
		require.NoError(t, err)
		g.publish(t, e)
	}
}

func (g *mailRig) status(t *testing.T, trip string) string {
	t.Helper()
	var st string
	require.NoError(t, g.pool.QueryRow(context.Background(), "SELECT status FROM trips WHERE trip_id = $1", trip).Scan(&st))
	return st
}

type message struct {
	Key     string `json:"key"`
	To      string `json:"to"`
	Subject string `json:"subject"`
	Text    string `json:"text"`
}

// mails lists the mail relay's messages of trip.
func (g *mailRig) mails(t *testing.T, trip string) []message {
	t.Helper()
	resp, err := http.Get(g.mailURL + "/messages?trip_id=" + url.QueryEscape(trip))
	require.NoError(t, err)
	defer resp.Body.Close()
	var body struct{ Items []message }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return body.Items
}

func (g *mailRig) keys(t *testing.T, trip string) []string {
	var keys []string
	for _, m := range g.mails(t, trip) {
		keys = append(keys, m.Key)
	}
	slices.Sort(keys)
	return keys
}

// stepDone reports whether the trip's step is done in the step log.
func (g *mailRig) stepDone(t *testing.T, trip, step string) bool {
	var st string
	err := g.pool.QueryRow(context.Background(), "SELECT status FROM steps WHERE trip_id = $1 AND step = $2", trip, step).Scan(&st)
	return err == nil && st == "done"
}

// TestDelayNotice: a trip whose refund is stuck stays canceling past the
// notice limit: its traveler gets exactly one notice (key
// <trip>:mail:delayed) naming the refund as what is still under way,
// though two replicas run the notice pass and it is run again and again;
// it was due by the database's clock (recorded no sooner than the limit
// after the trip began canceling). When the refund is done the trip
// settles canceled with its one final mail beside the notice. A trip that
// settles before the limit gets no notice.
func TestDelayNotice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The limit is far longer than any test machine takes to settle the
	// quick trip (at 800 ms, a loaded machine gave it a notice too); the
	// stuck trip is made due by moving its canceling_since back, by the
	// database's clock, once the pass has found it not yet due.
	const after = 10 * time.Minute
	g := newMailRig(t, after)
	stuck, quick := g.book(t, "notice-stuck"), g.book(t, "notice-quick")

	g.step(t, quick, events.HotelHeld, events.PaymentCharged, events.CarRejected, events.PaymentRefunded, events.HotelReleased)
	g.step(t, stuck, events.HotelHeld, events.PaymentCharged, events.CarRejected, events.PaymentRefundStuck, events.HotelReleased)
	testenv.Eventually(t, func() bool { return g.stepDone(t, quick, "mail") }, "the quick trip's cancellation mail is sent")
	testenv.Eventually(t, func() bool { return g.status(t, stuck) == StatusCanceling }, "the stuck trip is canceling")
	for _, s := range []*Service{g.a, g.b} {
		n, err := s.NoticePass(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "not due before the limit")
	}
	_, err := g.pool.Exec(ctx, `UPDATE trips SET canceling_since = canceling_since - make_interval(secs => $2) WHERE trip_id = $1`,
		stuck, (after + time.Second).Seconds())
	require.NoError(t, err)
	n, err := g.b.NoticePass(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "due once past the limit")
	testenv.Eventually(t, func() bool { return g.stepDone(t, stuck, NoticeStep) }, "the stuck trip's notice is sent")
	require.Equal(t, StatusCanceling, g.status(t, stuck))

	// Both replicas' passes look again: nothing more is recorded.
	for range 5 {
		for _, s := range []*Service{g.a, g.b} {
			n, err := s.NoticePass(ctx)
			require.NoError(t, err)
			require.Zero(t, n, "one notice per trip")
		}
	}
	var sinceCanceling time.Duration
	require.NoError(t, g.pool.QueryRow(ctx, `SELECT (s.created_at - t.canceling_since) FROM steps s JOIN trips t USING (trip_id)
		WHERE s.trip_id = $1 AND s.step = $2`, stuck, NoticeStep).Scan(&sinceCanceling))
	require.GreaterOrEqual(t, sinceCanceling, after, "due by the database's clock, not before")

	ms := g.mails(t, stuck)
	require.Len(t, ms, 1)
	require.Equal(t, stuck+":mail:delayed", ms[0].Key)
	require.Equal(t, "ada@example.com", ms[0].To)
	require.Equal(t, "Your trip "+stuck+" is being canceled", ms[0].Subject)
	require.Contains(t, ms[0].Text, "we could not book your trip (car sold out), so we are canceling it")
	require.Contains(t, ms[0].Text, "The refund of your card is still under way")
	require.Contains(t, ms[0].Text, "Nothing more is needed from you")
	require.Equal(t, []string{quick + ":mail:canceled"}, g.keys(t, quick), "settled before the limit: no notice")

	// The refund is done at last: canceled, with its final mail.
	g.step(t, stuck, events.PaymentRefunded)
	testenv.Eventually(t, func() bool { return g.stepDone(t, stuck, "mail") }, "the final mail is sent")
	require.Equal(t, StatusCanceled, g.status(t, stuck))
	require.Equal(t, []string{stuck + ":mail:canceled", stuck + ":mail:delayed"}, g.keys(t, stuck))
	final, notices, corrections := 0, 0, 0
	for _, k := range g.keys(t, stuck) {
		switch MailKind(k) {
		case "final":
			final++
		case "notice":
			notices++
		case "correction":
			corrections++
		}
	}
	require.Equal(t, []int{1, 1, 0}, []int{final, notices, corrections})
}

// TestCorrectionMail: an operator's repair (undo_leak, settle) naming a
// step service of a trip whose traveler was told it was confirmed records
// one correction mail (key <trip>:mail:correction) through the OPERATOR
// inbox, whichever replica takes it: a second repair, and the same action
// delivered again, send nothing more. A repair of a canceled trip, an
// action that is no repair and a settle of the trips service's own mail
// step send none.
func TestCorrectionMail(t *testing.T) {
	t.Parallel()
	g := newMailRig(t, time.Hour)
	confirmed, canceled := g.book(t, "corr-confirmed"), g.book(t, "corr-canceled")
	g.step(t, confirmed, events.HotelHeld, events.PaymentCharged, events.CarBooked)
	g.step(t, canceled, events.HotelRejected)
	testenv.Eventually(t, func() bool { return g.stepDone(t, confirmed, "mail") && g.stepDone(t, canceled, "mail") }, "both trips mailed")

	action := func(trip, act, service, reason string) event.Event {
		d := events.OperatorActionData{Action: act, TripID: trip, Service: service, Reason: reason, Operator: "ada", IdempotencyKey: reason}
		if act == events.ActionSettle {
			d.Outcome = events.SettleUndone
		}
		e, err := events.New(events.Source("reconciler"), events.OperatorAction, trip, d)
		require.NoError(t, err)
		return e
	}
	var ids []string
	send := func(e event.Event) {
		g.publish(t, e)
		ids = append(ids, e.ID())
	}
	// Not repairs, or not of a confirmed trip told so: nothing.
	send(action(confirmed, events.ActionPause, "hotel", "pause it"))
	send(action(confirmed, events.ActionSettle, "trips", "mail sent by hand"))
	send(action(canceled, events.ActionUndoLeak, "hotel", "leaked hold"))
	leak := action(confirmed, events.ActionUndoLeak, "hotel", "hold released by the hotel, ticket 7")
	send(leak)
	testenv.Eventually(t, func() bool { return g.stepDone(t, confirmed, CorrectionStep) }, "the correction is sent")
	send(leak) // the same action again (a relay's re-publish past the window)
	send(action(confirmed, events.ActionSettle, "payment", "refunded by hand"))
	testenv.Eventually(t, func() bool {
		var n int
		require.NoError(t, g.pool.QueryRow(context.Background(),
			"SELECT count(DISTINCT event_id) FROM inbox WHERE consumer = 'trips' AND event_id = ANY($1)", ids).Scan(&n))
		return n == len(ids)-1 // the leak twice
	}, "every action handled")
	require.False(t, g.stepDone(t, canceled, CorrectionStep))

	require.Equal(t, []string{confirmed + ":mail:confirmed", confirmed + ":mail:correction"}, g.keys(t, confirmed))
	require.Equal(t, []string{canceled + ":mail:canceled"}, g.keys(t, canceled), "a canceled trip's mail said nothing is held: no correction")
	for _, m := range g.mails(t, confirmed) {
		if MailKind(m.Key) != "correction" {
			continue
		}
		require.Equal(t, "Correction: your trip "+confirmed, m.Subject)
		require.Contains(t, m.Text, "we wrote that your trip "+confirmed+" is confirmed")
		require.Contains(t, m.Text, "the hotel record of your trip is being undone (hold released by the hotel, ticket 7)")
	}
	require.True(t, IsFinalMailKey(confirmed+":mail:confirmed"))
	require.False(t, IsFinalMailKey(confirmed+":mail:correction"))
}
