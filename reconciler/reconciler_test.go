package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/sim"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type bundle struct {
	pool      *pgxpool.Pool
	js        jetstream.JetStream
	companies string // base URL of the simulators: <companies>/hotel ...
	reg       *prometheus.Registry
	r         *Reconciler

	mu        sync.Mutex
	published map[string]uint64 // stream -> highest sequence the test stored on it
}

// stored notes a PubAck, so that caughtUp waits for the consumer to pass it:
// a PubAck can reach the publisher before the server counts the message as
// pending for the stream's consumers (nats-server signals them from its own
// goroutine), so "nothing pending" alone can be read before the message.
func (b *bundle) stored(ack *jetstream.PubAck) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.published == nil {
		b.published = map[string]uint64{}
	}
	b.published[ack.Stream] = max(b.published[ack.Stream], ack.Sequence)
}

// setup migrates a fresh database, starts embedded NATS with the streams
// and the company simulators, and builds a Reconciler (not yet running).
func setup(t testing.TB, mod func(*Config)) *bundle {
	t.Helper()
	ctx := context.Background()
	pool, url := testenv.SchemaPool(t, Schema, tripsql.SetSaga, tripsql.SetReconciler)
	_, _, js := testenv.JetStream(t)
	sims, err := sim.New(ctx, sim.Config{DatabaseURL: url})
	require.NoError(t, err)
	hs := httptest.NewServer(sims.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(sims.Close)
	b := &bundle{pool: pool, js: js, companies: hs.URL, reg: prometheus.NewRegistry()}
	rc := Config{
		Pool: pool, JetStream: js,
		Companies: map[string]*provider.Client{
			"hotel": provider.Hotel(hs.URL + "/hotel"), "payment": provider.Payments(hs.URL + "/payments"), "car": provider.Cars(hs.URL + "/cars"),
		},
		Interval: time.Hour, OrphanGrace: time.Nanosecond, Registerer: b.reg,
	}
	if mod != nil {
		mod(&rc)
	}
	b.r, err = New(rc)
	require.NoError(t, err)
	return b
}

// start runs the reconciler until the test ends.
func (b *bundle) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = b.r.Run(ctx, nil); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// ev returns an event of type typ about trip, as its owning service
// would publish it.
func ev(t testing.TB, typ, trip string) event.Event {
	t.Helper()
	et, ok := events.Selected().Lookup(typ)
	require.True(t, ok, typ)
	var data any = events.StepData{TripID: trip, Step: et.Service, IdempotencyKey: trip + ":" + et.Service}
	switch typ {
	case events.TripRequested:
		data = events.TripRequestedData{TripID: trip}
	case events.TripConfirmed, events.TripCanceled:
		data = events.TripSettledData{TripID: trip, Status: strings.TrimSuffix(strings.TrimPrefix(typ, "io.tripsaga.trip."), ".v1")}
	}
	e, err := events.New(events.Source(et.Service), typ, trip, data)
	require.NoError(t, err)
	return e
}

func msgOf(t testing.TB, e event.Event) *nats.Msg {
	t.Helper()
	h, err := events.EncodeHeaders(e)
	require.NoError(t, err)
	subj, err := events.Subject(e.Type(), e.Subject())
	require.NoError(t, err)
	m := &nats.Msg{Subject: subj, Data: e.Data(), Header: nats.Header{}}
	for k, v := range h {
		m.Header[k] = []string{v}
	}
	return m
}

// publish stores e on its stream; msgID defaults to the event id.
func (b *bundle) publish(t testing.TB, e event.Event, msgID string) {
	t.Helper()
	if msgID == "" {
		msgID = e.ID()
	}
	ack, err := b.js.PublishMsg(context.Background(), msgOf(t, e), jetstream.WithMsgID(msgID))
	require.NoError(t, err)
	b.stored(ack)
}

// caughtUp reports whether every durable "reconciler" consumer exists, has
// nothing pending or unacknowledged, and has acknowledged every message the
// test stored on its stream (see stored).
func (b *bundle) caughtUp() bool {
	ctx := context.Background()
	for stream := range events.Selected().Streams(projectionTypes()) {
		c, err := b.js.Consumer(ctx, stream, ProjectionName)
		if err != nil {
			return false
		}
		i, err := c.Info(ctx)
		if err != nil || i.NumPending != 0 || i.NumAckPending != 0 {
			return false
		}
		b.mu.Lock()
		want := b.published[stream]
		b.mu.Unlock()
		if i.AckFloor.Stream < want {
			return false
		}
	}
	return true
}

func (b *bundle) view(t testing.TB) []TripView {
	t.Helper()
	rows, err := queries.TripViewListAll(context.Background(), b.pool)
	require.NoError(t, err)
	out := make([]TripView, 0, len(rows))
	for _, r := range rows {
		out = append(out, tripViewFromRow(r))
	}
	return out
}

func (b *bundle) viewOf(t testing.TB, trip string) (TripView, bool) {
	v, err := b.r.View(context.Background(), trip)
	if err != nil {
		require.ErrorIs(t, err, ErrTripNotFound)
		return TripView{}, false
	}
	return v, true
}

func (b *bundle) inboxRows(t testing.TB) int {
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM inbox WHERE consumer = $1", ProjectionName).Scan(&n))
	return n
}

// Scenarios: the events of one trip and the status they lead to.
var scenarios = []struct {
	name    string
	types   []string
	status  string
	settled string
}{
	{"Confirmed", []string{events.TripRequested, events.HotelHeld, events.PaymentCharged, events.CarBooked, events.TripConfirmed, events.MailSent}, "confirmed", "confirmed"},
	{"CarSoldOut", []string{events.TripRequested, events.HotelHeld, events.PaymentCharged, events.CarRejected, events.PaymentRefunded, events.HotelReleased, events.TripCanceled, events.MailSent}, "canceled", "canceled"},
	{"Declined", []string{events.TripRequested, events.HotelHeld, events.PaymentDeclined}, "canceling", ""},
	{"DeclinedAndReleased", []string{events.TripRequested, events.HotelHeld, events.PaymentDeclined, events.HotelReleased}, "canceled", ""},
	{"Pending", []string{events.TripRequested, events.HotelHeld, events.PaymentCharged}, "pending", ""},
}

func TestProjection(t *testing.T) {
	t.Parallel()

	t.Run("AnyArrivalOrderGivesTheSameView", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.start(t)
		rng := rand.New(rand.NewPCG(1, 2))
		var all []event.Event
		type want struct{ status, settled string }
		wants := map[string]want{}
		for _, sc := range scenarios {
			for i := range 4 {
				trip := fmt.Sprintf("T-%s-%d", sc.name, i)
				wants[trip] = want{sc.status, sc.settled}
				for _, typ := range sc.types {
					all = append(all, ev(t, typ, trip))
				}
			}
		}
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		for _, e := range all {
			b.publish(t, e, "")
		}
		testenv.Eventually(t, b.caughtUp, "projection caught up")
		for trip, w := range wants {
			v, ok := b.viewOf(t, trip)
			require.True(t, ok, trip)
			require.Equal(t, w.status, v.Status, trip)
			require.Equal(t, w.settled, v.Settled, trip)
			require.True(t, v.Requested, trip)
		}
		for _, sc := range scenarios {
			v, _ := b.viewOf(t, "T-"+sc.name+"-0")
			require.Len(t, v.Seen, len(sc.types))
			require.Equal(t, len(sc.types), v.Events)
			require.IsIncreasing(t, v.Seen, "seen is a sorted set")
		}
	})

	t.Run("DuplicateEventHasNoSecondEffect", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.start(t)
		e := ev(t, events.HotelHeld, "T-dup")
		b.publish(t, e, "first")
		b.publish(t, e, "second") // past broker dedup: another Nats-Msg-Id
		b.publish(t, ev(t, events.TripRequested, "T-dup"), "")
		testenv.Eventually(t, b.caughtUp, "projection caught up")
		v, ok := b.viewOf(t, "T-dup")
		require.True(t, ok)
		require.Equal(t, 2, v.Events, "hotel.held counted once, trip.requested once")
		require.Equal(t, []string{"hotel.held", "trip.requested"}, v.Seen)
		require.Equal(t, "pending", v.Status)
		require.Equal(t, 2, b.inboxRows(t))
	})

	t.Run("FirstAndLastEventTimesAreTheEvents", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.start(t)
		base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		late, early := ev(t, events.HotelHeld, "T-time"), ev(t, events.TripRequested, "T-time")
		late.SetTime(base.Add(time.Minute))
		early.SetTime(base)
		b.publish(t, late, "")
		b.publish(t, early, "")
		testenv.Eventually(t, b.caughtUp, "projection caught up")
		v, _ := b.viewOf(t, "T-time")
		require.Equal(t, base, v.FirstEventAt)
		require.Equal(t, base.Add(time.Minute), v.LastEventAt)
	})
}

func TestStatus(t *testing.T) {
	t.Parallel()
	for _, sc := range scenarios {
		var seen []string
		for _, typ := range sc.types {
			seen = append(seen, events.Kind(typ))
		}
		status, settled := Status(events.Selected(), seen)
		require.Equal(t, sc.status, status, sc.name)
		require.Equal(t, sc.settled, settled, sc.name)
	}
	status, settled := Status(events.Selected(), []string{"trip.canceled"})
	require.Equal(t, "canceled", status, "a trip.canceled event settles the trip by itself")
	require.Equal(t, "canceled", settled)
}

// gauge reads the value of a gauge or counter with one label from the
// registry, as /metrics would show it.
func (b *bundle) gauge(t *testing.T, name, label string) float64 {
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// company calls for the tests.
func (b *bundle) hold(t *testing.T, trip string) {
	_, err := provider.Hotel(b.companies+"/hotel").Create(context.Background(), trip+":hotel", map[string]any{
		"trip_id": trip, "property_id": "P-100", "check_in": "2026-12-18", "nights": 2,
		"guest": map[string]string{"name": "Ada Example", "email": "ada@example.com"},
	})
	require.NoError(t, err)
}

func (b *bundle) charge(t *testing.T, trip string) {
	r, err := provider.Payments(b.companies+"/payments").Create(context.Background(), trip+":charge", map[string]any{
		"trip_id": trip, "amount_cents": 33000, "currency": "USD", "card_token": "tok_visa_ok",
	})
	require.NoError(t, err)
	require.Equal(t, provider.Done, r.Outcome)
}

func (b *bundle) book(t *testing.T, trip string) {
	_, err := provider.Cars(b.companies+"/cars").Create(context.Background(), trip+":car", map[string]any{
		"trip_id": trip, "car_class": "compact", "pickup": "2026-12-18", "return": "2026-12-20",
		"driver": map[string]string{"name": "Ada Example", "email": "ada@example.com"},
	})
	require.NoError(t, err)
}

// publishAll publishes events of types about trip as the services would:
// stamped with the trip version of this process's STEPS.
func (b *bundle) publishAll(t *testing.T, trip string, types ...string) {
	b.publishAllOf(t, events.Selected().Version(), trip, types...)
}

// publishAllOf is publishAll for a trip of version.
func (b *bundle) publishAllOf(t *testing.T, version, trip string, types ...string) {
	for _, typ := range types {
		e := ev(t, typ, trip)
		events.SetVersion(&e, version)
		b.publish(t, e, "")
	}
}

// open returns the open findings by "trip/kind".
func (b *bundle) open(t *testing.T) map[string]Finding {
	fs, err := b.r.Findings(context.Background(), false)
	require.NoError(t, err)
	out := map[string]Finding{}
	for _, f := range fs {
		out[f.TripID+"/"+f.Kind] = f
	}
	return out
}

func (b *bundle) sweep(t *testing.T) SweepResult {
	res, err := b.r.Sweep(context.Background())
	require.NoError(t, err)
	require.False(t, res.Skipped)
	return res
}

func TestSweep(t *testing.T) {
	t.Parallel()

	t.Run("FindsHalfTripsAndResolvesThemOnceFixed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.start(t)
		// The companies' records come before the events that settle the
		// trips, as in the saga (the startup sweep may run at any point).
		// Whole: confirmed with one of each.
		b.hold(t, "T-good")
		b.charge(t, "T-good")
		b.book(t, "T-good")
		b.publishAll(t, "T-good", scenarios[0].types...)
		// Canceled by events, but the hotel still holds the room.
		b.hold(t, "T-half")
		b.publishAll(t, "T-half", events.TripRequested, events.HotelHeld, events.PaymentDeclined, events.HotelReleased, events.TripCanceled)
		// Confirmed by events, but the car firm has no booking.
		b.hold(t, "T-nocar")
		b.charge(t, "T-nocar")
		b.publishAll(t, "T-nocar", scenarios[0].types...)
		// Canceled with a refunded charge: whole.
		b.charge(t, "T-refunded")
		_, err := provider.Payments(b.companies+"/payments").Undo(context.Background(), "T-refunded:charge")
		require.NoError(t, err)
		b.publishAll(t, "T-refunded", scenarios[1].types...)
		testenv.Eventually(t, b.caughtUp, "projection caught up")

		res := b.sweep(t)
		require.Equal(t, 2, res.Open[FindingHalf])
		open := b.open(t)
		require.Len(t, open, 2)
		require.Contains(t, open["T-half/half"].Detail, "holds held 1")
		require.Contains(t, open["T-nocar/half"].Detail, "bookings none")
		require.Equal(t, 2.0, b.gauge(t, "tripsaga_reconciler_findings", FindingHalf))
		require.Equal(t, 2.0, b.gauge(t, "tripsaga_reconciler_trips", "confirmed"))
		require.Equal(t, 2.0, b.gauge(t, "tripsaga_reconciler_trips", "canceled"))

		first := open["T-half/half"]
		b.sweep(t)
		again := b.open(t)["T-half/half"]
		require.Equal(t, first.ID, again.ID, "a finding that still holds is the same row")
		require.Equal(t, first.FirstSeen, again.FirstSeen)

		_, err = provider.Hotel(b.companies+"/hotel").Undo(context.Background(), "T-half:hotel")
		require.NoError(t, err)
		res = b.sweep(t)
		require.Equal(t, 1, res.Resolved)
		open = b.open(t)
		require.Len(t, open, 1)
		require.Contains(t, open, "T-nocar/half")
		require.Equal(t, 1.0, b.gauge(t, "tripsaga_reconciler_findings", FindingHalf))
		all, err := b.r.Findings(context.Background(), true)
		require.NoError(t, err)
		kept := false
		for _, f := range all {
			if f.ID == first.ID {
				require.NotNil(t, f.ResolvedAt, "the fixed finding is resolved, not deleted")
				kept = true
			}
		}
		require.True(t, kept)
	})

	t.Run("FindsOrphanRecords", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.start(t)
		b.publishAll(t, "T-known", events.TripRequested) // requested: not an orphan
		testenv.Eventually(t, b.caughtUp, "projection caught up")
		b.hold(t, "T-known")
		b.charge(t, "T-orphan") // no trip.requested anywhere
		res := b.sweep(t)
		require.Equal(t, map[string]int{FindingOrphan: 1}, res.Open)
		f := b.open(t)["T-orphan/orphan"]
		require.Contains(t, f.Detail, "charges T-orphan:charge charged")

		_, err := provider.Payments(b.companies+"/payments").Undo(context.Background(), "T-orphan:charge")
		require.NoError(t, err)
		res = b.sweep(t)
		require.Equal(t, 1, res.Resolved)
		require.Empty(t, b.open(t))
	})

	t.Run("YoungRecordIsNotYetAnOrphan", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.OrphanGrace = time.Hour })
		b.hold(t, "T-young")
		b.sweep(t)
		require.Empty(t, b.open(t))
	})

	t.Run("FindsStuckTrips", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil) // StuckAfter: the 120 s default
		b.start(t)
		old := time.Now().Add(-10 * time.Minute)
		for _, typ := range []string{events.TripRequested, events.HotelHeld, events.PaymentDeclined} {
			e := ev(t, typ, "T-stuck")
			e.SetTime(old)
			b.publish(t, e, "")
		}
		b.publishAll(t, "T-fresh", events.TripRequested, events.HotelHeld)
		testenv.Eventually(t, b.caughtUp, "projection caught up")
		b.sweep(t)
		open := b.open(t)
		require.Len(t, open, 1)
		require.Contains(t, open["T-stuck/stuck"].Detail, "canceling for 10m")

		b.publishAll(t, "T-stuck", events.HotelReleased, events.TripCanceled)
		testenv.Eventually(t, b.caughtUp, "projection caught up")
		res := b.sweep(t)
		require.Equal(t, 1, res.Resolved)
		require.Empty(t, b.open(t))
	})

	t.Run("CallsATripWithAStuckUndoOneOpenUndoNotHalf", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.start(t)
		// The refund is refused for good: the charge is still in force,
		// the room released (the hotel went on on payment.refund_stuck).
		b.charge(t, "T-open")
		b.publishAll(t, "T-open", events.TripRequested, events.HotelHeld, events.PaymentCharged, events.CarRejected,
			events.PaymentRefundStuck, events.HotelReleased)
		testenv.Eventually(t, b.caughtUp, "projection caught up")
		res := b.sweep(t)
		require.Equal(t, map[string]int{FindingOpenUndo: 1}, res.Open, "found at once, and not half or stuck")
		f := b.open(t)["T-open/open_undo"]
		require.Contains(t, f.Detail, "canceling with the undo of payment open")
		require.Contains(t, f.Detail, "charges charged 1")
		require.Equal(t, 1.0, b.gauge(t, "tripsaga_reconciler_findings", FindingOpenUndo))

		// An operator settles the refund (a refund made by hand), the trip
		// settles canceled: the open undo is closed.
		_, err := provider.Payments(b.companies+"/payments").Undo(context.Background(), "T-open:charge")
		require.NoError(t, err)
		b.publishAll(t, "T-open", events.PaymentRefunded, events.TripCanceled)
		testenv.Eventually(t, b.caughtUp, "projection caught up")
		res = b.sweep(t)
		require.Equal(t, 1, res.Resolved)
		require.Empty(t, b.open(t))
	})

	t.Run("FailsWithoutJudgingWhenACompanyCannotBeListed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.charge(t, "T-orphan")
		b.sweep(t)
		require.Len(t, b.open(t), 1)
		b.r.cfg.Companies["car"] = provider.Cars("http://127.0.0.1:1/cars")
		_, err := b.r.Sweep(context.Background())
		require.ErrorContains(t, err, "list bookings")
		require.Len(t, b.open(t), 1, "findings left as they were")
		require.Equal(t, 1.0, b.gauge(t, "tripsaga_reconciler_sweeps_total", "failed"))
	})
}

func TestDashboard(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.start(t)
	b.publishAll(t, "T-dash", events.TripRequested, events.HotelHeld)
	b.charge(t, "T-lost")
	testenv.Eventually(t, b.caughtUp, "projection caught up")
	b.sweep(t)
	mux := http.NewServeMux()
	b.r.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	get := func(path string) (int, string, string) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
	}

	code, ct, body := get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, ct, "text/html")
	require.Contains(t, body, "T-dash")
	require.Contains(t, body, "<code>hotel.held</code>")
	require.Contains(t, body, "T-lost")
	require.Contains(t, body, "orphan")
	// Issue 19 item 10: the findings sat below a 19-row lag table; what
	// needs a person comes first.
	require.Less(t, strings.Index(body, "Open findings"), strings.Index(body, "Consumers' lag"), "the findings before the lag table")

	code, _, body = get("/findings")
	require.Equal(t, http.StatusOK, code)
	var fs struct{ Items []Finding }
	require.NoError(t, json.Unmarshal([]byte(body), &fs))
	require.Len(t, fs.Items, 1)
	require.Equal(t, "T-lost", fs.Items[0].TripID)

	code, ct, body = get("/view/T-dash")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, ct, "application/json")
	var v struct {
		TripView
		Findings []Finding `json:"findings"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	require.Equal(t, "pending", v.Status)
	require.Equal(t, []string{"hotel.held", "trip.requested"}, v.Seen)
	require.NotNil(t, v.Findings)

	code, ct, _ = get("/view/T-nobody")
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, "application/problem+json", ct)
	code, _, _ = get("/nowhere")
	require.Equal(t, http.StatusNotFound, code)

	// Item 11 of issue 7: ids that cannot be a trip are 404 problem+json,
	// never 500 nor PostgreSQL's error.
	for _, path := range []string{"/view/%00", "/view/%FF", "/view/T-%00", "/view/T-%FF%FE", "/view/T-a%20b"} {
		code, ct, body := get(path)
		require.Equal(t, http.StatusNotFound, code, "%s: %s", path, body)
		require.Equal(t, "application/problem+json", ct, path)
	}
	code, _, body = get("/findings?all=%00%FF")
	require.Equal(t, http.StatusOK, code, body)

	// Item 16 of issue 7: the page's two trip counts say what they count.
	_, _, body = get("/")
	require.Contains(t, body, "<th>trips in the projection now</th><td>1</td>")
	require.Contains(t, body, "<th>trips the last sweep checked</th><td>1</td><td>the projection as it was when that sweep started</td>")
	require.Contains(t, body, "<th>company records the last sweep read</th><td>1</td><td>the hotel's holds, the card processor's charges and the car firm's bookings, all statuses</td>")
}

// Item 2 of issue 7 (the API part): PostgreSQL unreachable (nothing
// listens on its port): every view answers 503 problem+json with
// Retry-After, never 500.
func TestDashboardAnswers503WhilePostgreSQLIsDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	pool, err := pgxpool.New(context.Background(), fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, _, js := testenv.JetStream(t)
	r, err := New(Config{Pool: pool, JetStream: js, Companies: map[string]*provider.Client{
		"hotel": provider.Hotel("http://127.0.0.1:1"), "payment": provider.Payments("http://127.0.0.1:1"), "car": provider.Cars("http://127.0.0.1:1"),
	}})
	require.NoError(t, err)
	mux := http.NewServeMux()
	r.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	for _, path := range []string{"/", "/findings", "/findings?all=1", "/view/T-1"} {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s: %s", path, body)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), path)
		require.Equal(t, strconv.Itoa(process.RetryAfterSeconds), resp.Header.Get("Retry-After"), path)
	}
}

// publishScenarioTrips publishes n trips cycling through the scenarios,
// shuffled, and returns how many events it published.
func (b *bundle) publishScenarioTrips(t testing.TB, prefix string, n int, seed uint64) int {
	rng := rand.New(rand.NewPCG(seed, 7))
	var all []event.Event
	for i := range n {
		sc := scenarios[i%len(scenarios)]
		for _, typ := range sc.types {
			all = append(all, ev(t, typ, fmt.Sprintf("%s-%d", prefix, i)))
		}
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	futures := make([]jetstream.PubAckFuture, 0, len(all))
	for _, e := range all {
		f, err := b.js.PublishMsgAsync(msgOf(t, e), jetstream.WithMsgID(e.ID()))
		require.NoError(t, err)
		futures = append(futures, f)
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("async publish did not complete")
	}
	for _, f := range futures {
		select {
		case ack := <-f.Ok():
			b.stored(ack)
		case err := <-f.Err():
			t.Fatalf("async publish: %v", err)
		}
	}
	return len(all)
}

func TestReplay(t *testing.T) {
	t.Parallel()

	t.Run("RebuildsExactlyTheLiveView", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.start(t)
		n := b.publishScenarioTrips(t, "T", 60, 3)
		dup := ev(t, events.HotelHeld, "T-0")
		b.publish(t, dup, "dup-a")
		b.publish(t, dup, "dup-b") // the same event stored twice
		ack, err := b.js.PublishMsg(context.Background(), &nats.Msg{Subject: "hotel.held.T-garbage", Data: []byte("garbage"), Header: nats.Header{"ce-id": {"1"}}})
		require.NoError(t, err)
		b.stored(ack)
		testenv.Eventually(t, b.caughtUp, "live projection caught up")
		live := b.view(t)
		require.Len(t, live, 60)
		inbox := b.inboxRows(t)

		stats, err := Replay(context.Background(), ReplayConfig{Pool: b.pool, JetStream: b.js, BatchSize: 64})
		require.NoError(t, err)
		require.Equal(t, n+3, stats.Events)
		require.Equal(t, n+1, stats.Applied)
		require.Equal(t, 1, stats.Duplicates)
		require.Equal(t, 1, stats.Skipped)
		require.EqualValues(t, 60, stats.Trips)
		require.Equal(t, stats.Events, stats.PerStream["TRIPS"]+stats.PerStream["HOTEL"]+stats.PerStream["PAYMENT"]+stats.PerStream["CAR"])
		require.Equal(t, live, b.view(t))
		require.Equal(t, inbox, b.inboxRows(t))

		// The durable consumers go on from where they were.
		b.publishAll(t, "T-after", events.TripRequested)
		testenv.Eventually(t, func() bool { _, ok := b.viewOf(t, "T-after"); return ok }, "live projection after replay")
		v, _ := b.viewOf(t, "T-after")
		require.Equal(t, 1, v.Events)
	})

	t.Run("IsSafeWhileTheLiveProjectionRuns", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.start(t)
		b.publishScenarioTrips(t, "A", 100, 4)
		testenv.Eventually(t, b.caughtUp, "live projection caught up")
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.publishScenarioTrips(t, "B", 100, 5) // while the replay runs
		}()
		_, err := Replay(context.Background(), ReplayConfig{Pool: b.pool, JetStream: b.js, BatchSize: 50})
		require.NoError(t, err)
		wg.Wait()
		testenv.Eventually(t, b.caughtUp, "live projection caught up")
		during := b.view(t)
		require.Len(t, during, 200)
		_, err = Replay(context.Background(), ReplayConfig{Pool: b.pool, JetStream: b.js})
		require.NoError(t, err)
		require.Equal(t, b.view(t), during, "no event lost or counted twice")
	})

	t.Run("SweepIsSkippedWhileReplaying", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		ctx := context.Background()
		conn, err := b.pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		require.NoError(t, queries.ReplayLock(ctx, conn)) // as a replay does
		res, err := b.r.Sweep(ctx)
		require.NoError(t, err)
		require.True(t, res.Skipped)
		require.NoError(t, queries.ReplayUnlock(ctx, conn))
		require.False(t, b.sweep(t).Skipped)
	})

	t.Run("OneReplicaSweepsAtATime", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		ctx := context.Background()
		// Another replica's sweep holds the leader lock in its transaction.
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // test
		locked, err := queries.SweepTryLockLeader(ctx, tx)
		require.NoError(t, err)
		require.True(t, locked)
		res, err := b.r.Sweep(ctx)
		require.NoError(t, err)
		require.True(t, res.Skipped)
		require.Equal(t, "another replica was sweeping", res.SkippedFor)
		require.NoError(t, tx.Rollback(ctx))
		require.False(t, b.sweep(t).Skipped)
	})

	t.Run("RefusesOtherProjections", func(t *testing.T) {
		t.Parallel()
		_, err := ReplayProjection(context.Background(), "trips", ReplayConfig{})
		require.ErrorIs(t, err, ErrUnknownProjection)
	})
}

// BenchmarkReplay replays 2000 events (400 trips of 5 events) and reports
// events/s.
func BenchmarkReplay(b *testing.B) {
	bb := setup(b, nil)
	rng := rand.New(rand.NewPCG(9, 9))
	types := []string{events.TripRequested, events.HotelHeld, events.PaymentCharged, events.CarBooked, events.TripConfirmed}
	var all []event.Event
	for i := range 4000 {
		for _, typ := range types {
			all = append(all, ev(b, typ, fmt.Sprintf("T-%d", i)))
		}
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	for _, e := range all {
		_, err := bb.js.PublishMsgAsync(msgOf(b, e), jetstream.WithMsgID(e.ID()))
		require.NoError(b, err)
	}
	<-bb.js.PublishAsyncComplete()
	var events, secs float64
	for b.Loop() {
		stats, err := Replay(context.Background(), ReplayConfig{Pool: bb.pool, JetStream: bb.js})
		require.NoError(b, err)
		require.Equal(b, 20000, stats.Events)
		require.EqualValues(b, 4000, stats.Trips)
		events += float64(stats.Events)
		secs += stats.Duration.Seconds()
	}
	b.ReportMetric(events/secs, "events/s")
}
