package inbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/internal/tracing"
	"github.com/tripsaga/tripsaga/outbox"
)

// Tracing (issue 10, item 2) through the outbox: outbox.Write stamps each event
// with its span (ce-traceparent), the batch relay and the local publish
// are spans of that trace, and in batch mode each event handled is a span
// of its own, the child of its own producer, whose context the events its
// handler writes carry. Not parallel: the tracer provider is the process's.
func TestTraceContextThroughTheOutbox(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tracing.Use(tp)
	defer func() { tracing.Use(nil); _ = tp.Shutdown(context.Background()) }()
	b := setup(t)
	ctx := context.Background()
	spansNamed := func(name string) []tracetest.SpanStub {
		var out []tracetest.SpanStub
		for _, s := range exp.GetSpans() {
			if s.Name == name {
				out = append(out, s)
			}
		}
		return out
	}
	attr := func(s tracetest.SpanStub, k string) string {
		for _, a := range s.Attributes {
			if string(a.Key) == k {
				return a.Value.String()
			}
		}
		return ""
	}

	// Ten producers, each a trace of its own, written and published by
	// the batch relay before any consumer runs, so the inbox takes them in
	// batches.
	const n = 10
	producers := map[string]trace.SpanContext{} // trip -> its outbox.Write span
	for i := range n {
		trip := fmt.Sprintf("T-tr%d", i)
		pctx, root := tracing.Start(ctx, "producer "+trip, trace.SpanKindInternal)
		e := newEvent(t, trip)
		tx, err := b.pool.Begin(pctx)
		require.NoError(t, err)
		require.NoError(t, outbox.Write(pctx, tx, e))
		require.NoError(t, tx.Commit(pctx))
		root.End()
		require.Empty(t, e.Extensions(), "the caller's event is left as it was")
		for _, s := range spansNamed("outbox write " + events.HotelHeld) {
			if attr(s, "tripsaga.trip_id") == trip {
				require.Equal(t, root.SpanContext().SpanID(), s.Parent.SpanID(), "outbox.Write is a child of the caller's span")
				producers[trip] = s.SpanContext
			}
		}
		require.True(t, producers[trip].IsValid(), "the outbox.Write span of %s", trip)
	}
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, JetStream: b.js})
	require.NoError(t, err)
	drain(t, r)
	for _, s := range spansNamed("outbox publish hotel.held.T-tr3") {
		require.Equal(t, "batch", attr(s, "tripsaga.relay.mode"))
		require.Equal(t, producers["T-tr3"].SpanID(), s.Parent.SpanID(), "the batch relay's publish is a child of the event's outbox.Write")
	}
	require.Len(t, spansNamed("outbox publish hotel.held.T-tr3"), 1)

	// The handler writes an event of its own for each event it handles.
	handler := func(ctx context.Context, tx pgx.Tx, e event.Event) error {
		out, err := events.New(events.Source("payment"), events.PaymentCharged, e.Subject(), events.StepData{TripID: e.Subject(), Step: "payment"})
		if err != nil {
			return err
		}
		return outbox.Write(ctx, tx, out)
	}
	in, err := New(Config{
		Name: "traced", Stream: events.StreamHotel, FilterSubjects: []string{"hotel.held.>"},
		Types: []string{events.HotelHeld}, Pool: b.pool, JetStream: b.js, Handler: handler, BatchApply: HandlerBatch(handler),
		Concurrency: 1, BatchSize: 64,
	})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = in.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, func() bool { return len(spansNamed("process "+events.HotelHeld)) >= n }, "every event handled")

	batched := false
	for _, s := range spansNamed("process " + events.HotelHeld) {
		trip := attr(s, "tripsaga.trip_id")
		p := producers[trip]
		require.Equal(t, trace.SpanKindConsumer, s.SpanKind)
		require.Equal(t, p.TraceID(), s.SpanContext.TraceID(), "%s: the consume span is in its producer's trace", trip)
		require.Equal(t, p.SpanID(), s.Parent.SpanID(), "%s: the consume span is a child of its producer's", trip)
		require.Equal(t, "traced", attr(s, "tripsaga.consumer"))
		require.Equal(t, "handled", attr(s, "tripsaga.outcome"))
		batched = batched || attr(s, "messaging.batch.message_count") > "1"

		// The event the handler wrote carries the context of its outbox.Write, a
		// child of the consume span.
		var tp string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT headers->>'ce-traceparent' FROM outbox WHERE nats_subject = $1", "payment.charged."+trip).Scan(&tp))
		var w tracetest.SpanStub
		for _, ws := range spansNamed("outbox write " + events.PaymentCharged) {
			if attr(ws, "tripsaga.trip_id") == trip {
				w = ws
			}
		}
		require.Equal(t, s.SpanContext.SpanID(), w.Parent.SpanID(), "%s: the handler's outbox.Write is a child of the consume span", trip)
		require.Equal(t, fmt.Sprintf("00-%s-%s-01", p.TraceID(), w.SpanContext.SpanID()), tp, trip)
	}
	require.True(t, batched, "events were handled in batches")

	// The local publish right after the commit is a span of the trace too.
	lr, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, JetStream: b.js, PollInterval: time.Hour, LocalGrace: 50 * time.Second})
	require.NoError(t, err)
	lctx, lcancel := context.WithCancel(ctx)
	ldone := make(chan struct{})
	go func() { _ = lr.Run(lctx); close(ldone) }()
	defer func() { lcancel(); <-ldone }()
	testenv.Eventually(t, lr.Running, "relay running")
	pctx, root := tracing.Start(ctx, "producer local", trace.SpanKindInternal)
	tx, err := b.pool.Begin(pctx)
	require.NoError(t, err)
	wctx, committed := outbox.WithAfterCommit(pctx, lr)
	e := newEvent(t, "T-local")
	require.NoError(t, outbox.Write(wctx, tx, e))
	require.NoError(t, tx.Commit(pctx))
	committed()
	root.End()
	testenv.Eventually(t, func() bool { return len(spansNamed("outbox publish hotel.held.T-local")) == 1 }, "the local publish span ended at its PubAck")
	pub := spansNamed("outbox publish hotel.held.T-local")[0]
	require.Equal(t, "local", attr(pub, "tripsaga.relay.mode"))
	require.Equal(t, root.SpanContext().TraceID(), pub.SpanContext.TraceID())
}

// While tracing is off, events are stored without traceparent.
func TestNoTraceContextWhileTracingIsOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := newEvent(t, "T-off")
	writeEvents(t, b, e)
	var headers map[string]string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT headers FROM outbox WHERE event_id = $1", e.ID()).Scan(&headers))
	require.NotContains(t, headers, events.HeaderTraceparent)
	require.Equal(t, e.ID(), headers["ce-id"])
}
