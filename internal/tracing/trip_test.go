package tracing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/internal/tracing"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/services/car"
	"github.com/tripsaga/tripsaga/services/hotel"
	"github.com/tripsaga/tripsaga/services/payment"
	"github.com/tripsaga/tripsaga/services/trips"
	"github.com/tripsaga/tripsaga/sim"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// system is every service of a trip, in this test process, on real
// PostgreSQL (a database per service) and an embedded JetStream, calling
// the simulators over HTTP, with every span recorded in memory.
type system struct {
	spans             *tracetest.InMemoryExporter
	tripsURL, carsURL string
}

func start(t *testing.T) *system {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tracing.Use(tp)
	t.Cleanup(func() {
		tracing.Use(nil)
		_ = tp.Shutdown(context.Background())
	})
	ctx, cancel := context.WithCancel(context.Background())
	_, nc, js := testenv.JetStream(t)
	sims, err := sim.New(ctx, sim.Config{Memory: true})
	require.NoError(t, err)
	simSrv := httptest.NewServer(sims.Handler())
	t.Cleanup(func() { simSrv.Close(); sims.Close() })

	var wg sync.WaitGroup
	run := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("%s: %v", name, err)
			}
		}()
	}
	steps := []struct {
		spec  saga.Spec
		build saga.BuildFunc
	}{
		{hotel.Spec(simSrv.URL + "/hotel"), saga.Builder(hotel.Build)},
		{payment.Spec(simSrv.URL + "/payments"), saga.Builder(payment.Build)},
		{car.Spec(simSrv.URL + "/cars"), saga.Builder(car.Build)},
	}
	for _, st := range steps {
		pool, _ := testenv.SchemaPool(t, st.spec.Service, tripsql.SetSaga)
		svc, err := saga.NewService(saga.ServiceConfig{
			Pool: pool, JetStream: js, Catalogue: events.Default, Family: events.TripVersions(), Spec: st.spec, Build: st.build,
			Instance: "trace-test:" + st.spec.Service,
		})
		require.NoError(t, err)
		run(st.spec.Service, func(ctx context.Context) error { return svc.Run(ctx, nil) })
	}
	pool, _ := testenv.SchemaPool(t, "trips", tripsql.SetSaga, tripsql.SetTrips)
	ts, err := trips.New(trips.Config{Pool: pool, JetStream: js, MailURL: simSrv.URL + "/mail", Instance: "trace-test:trips"})
	require.NoError(t, err)
	run("trips", func(ctx context.Context) error { return ts.Run(ctx, nil) })
	mux := http.NewServeMux()
	ts.Handler(mux)
	// As process.Process.Serve serves it.
	api := httptest.NewServer(tracing.Middleware("trips", mux, process.Guard(nc, process.Problems(mux))))
	// Cleanups run last first: the services stop before their pools close.
	t.Cleanup(func() { api.Close(); cancel(); wg.Wait() })
	return &system{spans: exp, tripsURL: api.URL, carsURL: simSrv.URL + "/cars"}
}

// book posts a trip for email and returns its id.
func (s *system) book(t *testing.T, email string) string {
	t.Helper()
	day := func(n int) string { return time.Now().UTC().AddDate(0, 0, n).Format(time.DateOnly) }
	body := fmt.Sprintf(`{"traveler":{"name":"Ada Example","email":%q},"hotel":{"property_id":"P-100","check_in":%q,"nights":2},`+
		`"car":{"car_class":"compact","pickup":%q,"return":%q},"payment":{"card_token":"tok_visa_ok","amount_cents":33000,"currency":"USD"}}`,
		email, day(10), day(10), day(12))
	req, err := http.NewRequest(http.MethodPost, s.tripsURL+"/trips", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "key-"+email)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, resp.StatusCode, string(b))
	var trip struct {
		TripID string `json:"trip_id"`
	}
	require.NoError(t, json.Unmarshal(b, &trip))
	require.NotEmpty(t, trip.TripID)
	return trip.TripID
}

func attr(s tracetest.SpanStub, k attribute.Key) string {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value.String()
		}
	}
	return ""
}

// ofTrip returns the spans about trip: those naming it (trip id,
// Idempotency-Key) and the POST that created it.
func (s *system) ofTrip(trip string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, sp := range s.spans.GetSpans() {
		if attr(sp, tracing.KeyTripID) == trip || strings.HasPrefix(attr(sp, tracing.KeyIdempotencyKey), trip+":") {
			out = append(out, sp)
		}
	}
	return out
}

// call returns the span of the company call of trip named name ("hotel
// create", "payments refund"...) with the Idempotency-Key key, whose outcome
// is outcome.
func call(spans []tracetest.SpanStub, name, key, outcome string) (tracetest.SpanStub, bool) {
	for _, sp := range spans {
		if sp.Name == name && sp.SpanKind == trace.SpanKindClient && attr(sp, tracing.KeyIdempotencyKey) == key && attr(sp, tracing.KeyOutcome) == outcome {
			return sp, true
		}
	}
	return tracetest.SpanStub{}, false
}

// consumed returns the span of consumer handling an event of type typ.
func consumed(spans []tracetest.SpanStub, consumer, typ string) (tracetest.SpanStub, bool) {
	for _, sp := range spans {
		if sp.SpanKind == trace.SpanKindConsumer && attr(sp, tracing.KeyConsumer) == consumer && attr(sp, "cloudevents.event_type") == typ {
			return sp, true
		}
	}
	return tracetest.SpanStub{}, false
}

// settled reports whether every span of trip that was recorded has its
// parent recorded too (spans are recorded when they end, a parent often
// after its children), the POST that created the trip aside.
func (s *system) settled(trip string) bool {
	ids := map[trace.SpanID]bool{}
	for _, sp := range s.spans.GetSpans() {
		ids[sp.SpanContext.SpanID()] = true
	}
	for _, sp := range s.ofTrip(trip) {
		if !ids[sp.Parent.SpanID()] {
			return false
		}
	}
	return true
}

// checkOneTrace asserts that every span of trip is in the trace of the POST
// that created it, and that each span's parent was recorded too (no span
// hangs off a context the trace lost), except the POST itself.
func (s *system) checkOneTrace(t *testing.T, trip string) trace.TraceID {
	t.Helper()
	all := s.spans.GetSpans()
	var post tracetest.SpanStub
	for _, sp := range all {
		if sp.Name == "POST /trips" && sp.SpanKind == trace.SpanKindServer && attr(sp, tracing.KeyIdempotencyKey) != "" {
			for _, c := range all {
				if c.Parent.SpanID() == sp.SpanContext.SpanID() && attr(c, tracing.KeyTripID) == trip {
					post = sp
				}
			}
		}
	}
	require.True(t, post.SpanContext.IsValid(), "the POST /trips span of %s", trip)
	id := post.SpanContext.TraceID()
	byID := map[trace.SpanID]tracetest.SpanStub{}
	for _, sp := range all {
		byID[sp.SpanContext.SpanID()] = sp
	}
	mine := s.ofTrip(trip)
	require.NotEmpty(t, mine)
	for _, sp := range mine {
		require.Equal(t, id, sp.SpanContext.TraceID(), "span %q (%s) of %s is in another trace", sp.Name, attr(sp, tracing.KeyConsumer), trip)
		require.True(t, sp.Parent.IsValid(), "span %q has no parent", sp.Name)
		p, ok := byID[sp.Parent.SpanID()]
		require.True(t, ok, "the parent of span %q was not recorded", sp.Name)
		require.Equal(t, id, p.SpanContext.TraceID())
	}
	return id
}

// Item 2 of issue 10: one trip is one trace across trips, hotel, payment,
// car and the mail; the company calls carry their Idempotency-Key; a
// canceled trip's compensations belong to its trace too.
func TestOneTripIsOneTrace(t *testing.T) {
	s := start(t)

	// A trip that is confirmed.
	ok := s.book(t, "ada.ok@example.com")
	wantCalls := []struct{ name, key, outcome string }{
		{"hotel create", ok + ":hotel", "done"},
		{"payments create", ok + ":charge", "done"},
		{"cars create", ok + ":car", "done"},
		{"mail create", ok + ":mail:confirmed", "done"},
	}
	testenv.Eventually(t, func() bool {
		spans := s.ofTrip(ok)
		for _, c := range wantCalls {
			if _, found := call(spans, c.name, c.key, c.outcome); !found {
				return false
			}
		}
		// The trips projection of car.booked settled the trip (and asked
		// for the mail).
		_, found := consumed(spans, "trips", events.CarBooked)
		return found && s.settled(ok)
	}, "every company call of trip %s traced", ok)
	okTrace := s.checkOneTrace(t, ok)
	spans := s.ofTrip(ok)
	for _, c := range []struct{ consumer, typ string }{
		{"hotel", events.TripRequested}, {"payment", events.HotelHeld}, {"car", events.PaymentCharged},
		{"trips", events.HotelHeld}, {"trips", events.PaymentCharged}, {"trips", events.CarBooked},
	} {
		sp, found := consumed(spans, c.consumer, c.typ)
		require.True(t, found, "%s consuming %s", c.consumer, c.typ)
		require.Equal(t, okTrace, sp.SpanContext.TraceID())
	}
	for _, c := range wantCalls {
		sp, _ := call(spans, c.name, c.key, c.outcome)
		require.Equal(t, okTrace, sp.SpanContext.TraceID(), c.name)
		require.Equal(t, c.key, attr(sp, tracing.KeyIdempotencyKey))
		require.NotEmpty(t, attr(sp, tracing.KeyCompany))
		require.NotEmpty(t, attr(sp, tracing.KeyOperation))
	}
	var published bool
	for _, sp := range spans {
		published = published || strings.HasPrefix(sp.Name, "outbox publish ")
	}
	require.True(t, published, "the relay's publishes are in the trace")

	// A trip whose car is sold out: canceled after the charge, so the
	// charge is refunded and the hold released, and the mail says so.
	const email = "ada.nocar@example.com"
	require.NoError(t, sim.AddFault(context.Background(), s.carsURL, sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut, Match: map[string]string{"driver.email": email}}))
	no := s.book(t, email)
	undo := []struct{ name, key, outcome string }{
		{"cars create", no + ":car", "rejected"},
		{"payments refund", no + ":charge", "undone"},
		{"hotel release", no + ":hotel", "undone"},
		{"mail create", no + ":mail:canceled", "done"},
	}
	testenv.Eventually(t, func() bool {
		spans := s.ofTrip(no)
		for _, c := range undo {
			if _, found := call(spans, c.name, c.key, c.outcome); !found {
				return false
			}
		}
		_, found := consumed(spans, "trips", events.HotelReleased)
		return found && s.settled(no)
	}, "every compensation of trip %s traced", no)
	noTrace := s.checkOneTrace(t, no)
	require.NotEqual(t, okTrace, noTrace, "each trip is a trace of its own")
	spans = s.ofTrip(no)
	for _, c := range undo {
		sp, _ := call(spans, c.name, c.key, c.outcome)
		require.Equal(t, noTrace, sp.SpanContext.TraceID(), c.name)
	}
	// The undo spans are children of the compensation's consume spans.
	for _, c := range []struct{ consumer, typ, job string }{
		{"payment", events.CarRejected, "saga payment undo"},
		{"hotel", events.PaymentRefunded, "saga hotel undo"},
	} {
		cons, found := consumed(spans, c.consumer, c.typ)
		require.True(t, found, "%s consuming %s", c.consumer, c.typ)
		var job tracetest.SpanStub
		for _, sp := range spans {
			if sp.Name == c.job {
				job = sp
			}
		}
		require.Equal(t, cons.SpanContext.SpanID(), job.Parent.SpanID(), "%s is a child of %s's consume span of %s", c.job, c.consumer, c.typ)
	}
}

// While tracing is off nothing is started, nothing is allocated and events
// carry no traceparent.
func TestOffCostsNothing(t *testing.T) {
	require.False(t, tracing.Enabled())
	ctx := context.Background()
	e, err := events.New(events.Source("hotel"), events.HotelHeld, "T-1", events.StepData{TripID: "T-1"})
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() {
		c, span := tracing.Start(ctx, "x", trace.SpanKindInternal)
		span.End()
		_ = tracing.Inject(c, &e)
		c, span = tracing.StartConsume(ctx, "hotel", "TRIPS", e)
		tracing.End(span, errors.New("static"))
		_ = tracing.FromEvent(c, e)
	})
	// errors.New allocates once; the tracing calls do not.
	require.LessOrEqual(t, allocs, 1.0)
	require.Empty(t, e.Extensions())
}
