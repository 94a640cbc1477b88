// Package tracing is the OpenTelemetry tracing of every process: one trip
// is one trace across all services. The W3C trace context travels in the
// CloudEvents distributed-tracing extension (attributes traceparent and
// tracestate, headers ce-traceparent and ce-tracestate in binary mode):
// [Inject] stamps an event with the span of ctx when the outbox stores it,
// and [FromEvent] makes a consumer's span its child.
//
// Tracing is off unless a process calls [Setup] with
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, or
// a test calls [Use]: while it is off every function here returns at once
// (one atomic load), nothing is allocated and events carry no traceparent.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	"github.com/cloudevents/sdk-go/v2/event"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tripsaga/tripsaga/internal/httpx"
)

// ScopeName is the instrumentation scope of every span of the system.
const ScopeName = "github.com/tripsaga/tripsaga"

// The CloudEvents distributed-tracing extension's attributes (CloudEvents
// spec, extensions/distributed-tracing.md).
const (
	AttrTraceparent = "traceparent"
	AttrTracestate  = "tracestate"
)

// Span attribute keys of the system's own (beside OpenTelemetry's semantic
// conventions: messaging.*, http.*, cloudevents.*).
const (
	KeyIdempotencyKey = attribute.Key("tripsaga.idempotency_key")
	KeyCompany        = attribute.Key("tripsaga.company")
	KeyOperation      = attribute.Key("tripsaga.operation")
	KeyOutcome        = attribute.Key("tripsaga.outcome")
	KeyTripID         = attribute.Key("tripsaga.trip_id")
	KeyStep           = attribute.Key("tripsaga.step")
	KeyService        = attribute.Key("tripsaga.service")
	KeyConsumer       = attribute.Key("tripsaga.consumer")
)

//nolint:gochecknoglobals // the process's one tracer; nil = tracing off
var tracer atomic.Pointer[trace.Tracer]

var prop = propagation.TraceContext{} //nolint:gochecknoglobals // stateless

// Enabled reports whether spans are recorded.
func Enabled() bool { return tracer.Load() != nil }

// Use makes tp the provider of every span of the process (and the global
// OpenTelemetry provider, with the W3C trace-context propagator); nil turns
// tracing off again. Tests use it with an in-memory exporter.
func Use(tp trace.TracerProvider) {
	if tp == nil {
		tracer.Store(nil)
		otel.SetTracerProvider(noop.NewTracerProvider())
		return
	}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(prop)
	t := tp.Tracer(ScopeName)
	tracer.Store(&t)
}

// EnvEndpoint is the variable that turns the OTLP export on.
const EnvEndpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"

// Configured reports whether the environment asks for the OTLP export:
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set.
func Configured() bool {
	return os.Getenv(EnvEndpoint) != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Protocol is the OTLP protocol the environment asks for:
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else
// http/protobuf.
func Protocol() string {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return "http/protobuf"
}

// Setup exports the process's spans with OTLP over HTTP (otlptracehttp) or
// gRPC (otlptracegrpc, when [Protocol] is grpc), configured by the standard
// OTEL_EXPORTER_OTLP_* variables, when
// [Configured], as service.name service (in service.namespace "tripsaga",
// service.instance.id instance when not empty; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES override), sampled as OTEL_TRACES_SAMPLER says
// (parent-based always-on by default). Otherwise it does nothing and
// tracing stays off. The returned function flushes and stops the export.
func Setup(ctx context.Context, service, instance string) (func(context.Context) error, error) {
	if !Configured() {
		return func(context.Context) error { return nil }, nil
	}
	var exp sdktrace.SpanExporter
	var err error
	switch p := Protocol(); p {
	case "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("tracing: OTLP protocol %q (OTEL_EXPORTER_OTLP_PROTOCOL): want http/protobuf (the collector's port 4318) or grpc (4317)", p)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	attrs := []attribute.KeyValue{
		attribute.String("service.name", service),
		attribute.String("service.namespace", "tripsaga"),
	}
	if instance != "" {
		attrs = append(attrs, attribute.String("service.instance.id", instance))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	// Variables win over our defaults (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES).
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	Use(tp)
	return func(ctx context.Context) error {
		Use(nil)
		return errors.Join(tp.ForceFlush(ctx), tp.Shutdown(ctx))
	}, nil
}

// Start starts a span named name as a child of ctx's span. While tracing is
// off it returns ctx and a no-op span.
func Start(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	t := tracer.Load()
	if t == nil {
		return ctx, noop.Span{}
	}
	return (*t).Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// End ends span, with status error and the error recorded when err is not
// nil.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// carrier reads and writes a trace context as two strings.
type carrier struct{ parent, state *string }

func (c carrier) Get(key string) string {
	switch key {
	case AttrTraceparent:
		return *c.parent
	case AttrTracestate:
		return *c.state
	}
	return ""
}

func (c carrier) Set(key, value string) {
	switch key {
	case AttrTraceparent:
		*c.parent = value
	case AttrTracestate:
		*c.state = value
	}
}

func (c carrier) Keys() []string { return []string{AttrTraceparent, AttrTracestate} }

// Traceparent returns the W3C traceparent and tracestate of ctx's span,
// empty when tracing is off or ctx has no valid span.
func Traceparent(ctx context.Context) (traceparent, tracestate string) {
	if !Enabled() || !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	prop.Inject(ctx, carrier{&traceparent, &tracestate})
	return traceparent, tracestate
}

// WithParent returns ctx with the remote span context of traceparent and
// tracestate as its parent (for a span to start as its child), or ctx when
// tracing is off or traceparent is empty or not valid.
func WithParent(ctx context.Context, traceparent, tracestate string) context.Context {
	if !Enabled() || traceparent == "" {
		return ctx
	}
	return prop.Extract(ctx, carrier{&traceparent, &tracestate})
}

// WithParentPtr is [WithParent] of nullable columns.
func WithParentPtr(ctx context.Context, traceparent, tracestate *string) context.Context {
	if traceparent == nil || !Enabled() {
		return ctx
	}
	ts := ""
	if tracestate != nil {
		ts = *tracestate
	}
	return WithParent(ctx, *traceparent, ts)
}

// Inject sets e's traceparent and tracestate extension attributes (the
// CloudEvents distributed-tracing extension) to ctx's span, unless tracing
// is off, ctx has no valid span, or e already carries a traceparent. It
// reports whether it set them. e's context is shared by its copies: clone
// an event that must stay as it was first.
func Inject(ctx context.Context, e *event.Event) bool {
	if !Enabled() {
		return false
	}
	if _, ok := e.Extensions()[AttrTraceparent]; ok {
		return false
	}
	tp, ts := Traceparent(ctx)
	if tp == "" {
		return false
	}
	e.SetExtension(AttrTraceparent, tp)
	if ts != "" {
		e.SetExtension(AttrTracestate, ts)
	}
	return true
}

// OfEvent returns e's traceparent and tracestate extension attributes, empty
// when it has none.
func OfEvent(e event.Event) (traceparent, tracestate string) {
	ext := e.Extensions()
	if ext == nil {
		return "", ""
	}
	if v, ok := ext[AttrTraceparent].(string); ok {
		traceparent = v
	}
	if v, ok := ext[AttrTracestate].(string); ok {
		tracestate = v
	}
	return traceparent, tracestate
}

// FromEvent returns ctx with e's trace context (its producer's span) as the
// parent of the spans started from it; ctx when e has none or tracing is off.
func FromEvent(ctx context.Context, e event.Event) context.Context {
	if !Enabled() {
		return ctx
	}
	tp, ts := OfEvent(e)
	return WithParent(ctx, tp, ts)
}

// EventAttrs are the span attributes of a CloudEvent (OpenTelemetry's
// CloudEvents and messaging conventions).
func EventAttrs(e event.Event) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.message.id", e.ID()),
		attribute.String("cloudevents.event_id", e.ID()),
		attribute.String("cloudevents.event_type", e.Type()),
		attribute.String("cloudevents.event_source", e.Source()),
		attribute.String("cloudevents.event_subject", e.Subject()),
		KeyTripID.String(e.Subject()),
	}
}

// StartConsume starts the span of one event handled by consumer (kind
// consumer), a child of the event's producer context (its traceparent),
// named "process <type>". While tracing is off it returns ctx and a no-op
// span.
func StartConsume(ctx context.Context, consumer, stream string, e event.Event) (context.Context, trace.Span) {
	if !Enabled() {
		return ctx, noop.Span{}
	}
	attrs := append(EventAttrs(e),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.consumer.group.name", consumer),
		attribute.String("messaging.destination.name", stream),
		KeyConsumer.String(consumer))
	return Start(FromEvent(ctx, e), "process "+e.Type(), trace.SpanKindConsumer, attrs...)
}

// skipHTTP are the paths never traced: probes and scrapes.
func skipHTTP(path string) bool {
	return path == "/healthz" || path == "/readyz" || path == "/metrics" || strings.HasPrefix(path, "/debug/")
}

// Middleware traces every request h serves (a server span named after the
// route mux matches, "POST /trips", a child of the request's traceparent
// header when it has one), except /healthz, /readyz, /metrics and
// /debug/. service names the process (tripsaga.service). While tracing is
// off it calls h and nothing else.
func Middleware(service string, mux *http.ServeMux, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := tracer.Load()
		if t == nil || skipHTTP(r.URL.Path) {
			h.ServeHTTP(w, r)
			return
		}
		name, route := r.Method, ""
		if mux != nil {
			if _, pattern := mux.Handler(r); pattern != "" {
				_, route, _ = strings.Cut(pattern, " ")
				if route == "" {
					route = pattern
				}
				name = r.Method + " " + route
			}
		}
		ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		attrs := []attribute.KeyValue{
			attribute.String("http.request.method", r.Method),
			attribute.String("url.path", r.URL.Path),
			KeyService.String(service),
		}
		if route != "" {
			attrs = append(attrs, attribute.String("http.route", route))
		}
		if k := r.Header.Get("Idempotency-Key"); k != "" {
			attrs = append(attrs, KeyIdempotencyKey.String(k))
		}
		ctx, span := (*t).Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		defer span.End()
		sw := &httpx.StatusRecorder{ResponseWriter: w}
		h.ServeHTTP(sw, r.WithContext(ctx))
		code := sw.Status
		if code == 0 {
			code = http.StatusOK
		}
		span.SetAttributes(attribute.Int("http.response.status_code", code))
		if code >= 500 {
			span.SetStatus(codes.Error, http.StatusText(code))
		}
	})
}

// InjectHTTP sets the W3C traceparent (and tracestate) headers of an
// outgoing request to ctx's span, for a company that traces too.
func InjectHTTP(ctx context.Context, h http.Header) {
	if !Enabled() {
		return
	}
	prop.Inject(ctx, propagation.HeaderCarrier(h))
}
