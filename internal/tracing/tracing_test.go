package tracing_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/tracing"
)

// use records every span in memory until the test ends.
func use(t *testing.T) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tracing.Use(tp)
	t.Cleanup(func() {
		tracing.Use(nil)
		_ = tp.Shutdown(context.Background())
	})
	return exp
}

// An event stamped at Write carries the producer's span in traceparent
// (and tracestate); its consumer's span is that span's child.
func TestEventCarriesTheTraceContext(t *testing.T) {
	exp := use(t)
	ctx, producer := tracing.Start(context.Background(), "producer", trace.SpanKindProducer)
	e, err := events.New(events.Source("hotel"), events.HotelHeld, "T-1", events.StepData{TripID: "T-1"})
	require.NoError(t, err)
	require.True(t, tracing.Inject(ctx, &e))
	require.False(t, tracing.Inject(context.Background(), &e), "a traceparent already there is kept")
	tp, _ := tracing.OfEvent(e)
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, tp)
	producer.End()

	// Through the codec, as a consumer receives it.
	h, err := events.EncodeHeaders(e)
	require.NoError(t, err)
	nh := map[string][]string{}
	for k, v := range h {
		nh[k] = []string{v}
	}
	got, err := events.Decode(nh, e.Data())
	require.NoError(t, err)
	_, span := tracing.StartConsume(context.Background(), "payment", "HOTEL", got)
	span.End()
	spans := exp.GetSpans()
	require.Len(t, spans, 2)
	require.Equal(t, "process "+events.HotelHeld, spans[1].Name)
	require.Equal(t, trace.SpanKindConsumer, spans[1].SpanKind)
	require.Equal(t, spans[0].SpanContext.TraceID(), spans[1].SpanContext.TraceID())
	require.Equal(t, spans[0].SpanContext.SpanID(), spans[1].Parent.SpanID())
	require.True(t, spans[1].Parent.IsRemote())

	// An event without the extension starts a trace of its own.
	plain, err := events.New(events.Source("hotel"), events.HotelHeld, "T-2", events.StepData{TripID: "T-2"})
	require.NoError(t, err)
	_, span = tracing.StartConsume(context.Background(), "payment", "HOTEL", plain)
	span.End()
	require.False(t, exp.GetSpans()[2].Parent.IsValid())
}

// The middleware names a request's span after its route, continues the
// caller's traceparent, records the status code, and leaves the probes
// alone.
func TestMiddleware(t *testing.T) {
	exp := use(t)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /trips/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	srv := httptest.NewServer(tracing.Middleware("trips", mux, mux))
	t.Cleanup(srv.Close)

	ctx, caller := tracing.Start(context.Background(), "caller", trace.SpanKindClient)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/trips/T-9", nil)
	require.NoError(t, err)
	tracing.InjectHTTP(ctx, req.Header)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	caller.End()
	resp, err = http.Get(srv.URL + "/healthz")
	require.NoError(t, err)
	_ = resp.Body.Close()

	// The server's span ends once the answer is written, maybe after the
	// caller read it.
	var spans tracetest.SpanStubs
	require.Eventually(t, func() bool { spans = exp.GetSpans(); return len(spans) == 2 }, 5*time.Second, 10*time.Millisecond)
	byName := map[string]tracetest.SpanStub{}
	for _, sp := range spans {
		byName[sp.Name] = sp
	}
	server, ok := byName["GET /trips/{id}"]
	require.True(t, ok, "the request's span; /healthz is not traced")
	require.Equal(t, trace.SpanKindServer, server.SpanKind)
	require.Equal(t, byName["caller"].SpanContext.SpanID(), server.Parent.SpanID())
	attrs := map[string]string{}
	for _, a := range server.Attributes {
		attrs[string(a.Key)] = a.Value.String()
	}
	require.Equal(t, "404", attrs["http.response.status_code"])
	require.Equal(t, "/trips/{id}", attrs["http.route"])
	require.Equal(t, "trips", attrs[string(tracing.KeyService)])
}

// Without OTEL_EXPORTER_OTLP_ENDPOINT, Setup installs nothing; with it,
// spans go to that OTLP/HTTP endpoint with the process's service.name.
func TestSetupExportsWithOTLP(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	stop, err := tracing.Setup(context.Background(), "hotel", "hotel-2")
	require.NoError(t, err)
	require.False(t, tracing.Enabled())
	require.NoError(t, stop(context.Background()))

	var mu sync.Mutex
	var got []*collectortrace.ExportTraceServiceRequest
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		req := &collectortrace.ExportTraceServiceRequest{}
		if r.URL.Path == "/v1/traces" && proto.Unmarshal(b, req) == nil {
			mu.Lock()
			got = append(got, req)
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
	t.Setenv("OTEL_SERVICE_NAME", "")
	stop, err = tracing.Setup(context.Background(), "hotel", "hotel-2")
	require.NoError(t, err)
	require.True(t, tracing.Enabled())
	_, span := tracing.Start(context.Background(), "hotel create", trace.SpanKindClient, tracing.KeyIdempotencyKey.String("T-1:hotel"))
	span.End()
	require.NoError(t, stop(context.Background()))
	require.False(t, tracing.Enabled(), "stopped")

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1)
	rs := got[0].GetResourceSpans()
	require.Len(t, rs, 1)
	res := map[string]string{}
	for _, a := range rs[0].GetResource().GetAttributes() {
		res[a.GetKey()] = a.GetValue().GetStringValue()
	}
	require.Equal(t, "hotel", res["service.name"])
	require.Equal(t, "tripsaga", res["service.namespace"])
	require.Equal(t, "hotel-2", res["service.instance.id"])
	spans := rs[0].GetScopeSpans()[0].GetSpans()
	require.Len(t, spans, 1)
	require.Equal(t, "hotel create", spans[0].GetName())

	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	_, err = tracing.Setup(context.Background(), "hotel", "")
	require.ErrorContains(t, err, "http/json")
}
