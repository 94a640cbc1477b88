package saga_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/internal/tracing"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/sagatest"
	"github.com/tripsaga/tripsaga/services/hotel"
	"github.com/tripsaga/tripsaga/sim"
)

// Calls made later from the step log (the recovery pass, retries of an
// unknown outcome, the undo) belong to the trace of the span that asked for
// the step, or for its undo: the step row keeps its trace context. Not
// parallel: the tracer provider is the process's.
func TestStepCallsKeepTheTripsTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tracing.Use(tp)
	defer func() { tracing.Use(nil); _ = tp.Shutdown(context.Background()) }()
	b := setup(t)
	ctx := context.Background()
	// The first hold is answered 503: unknown, asked again by key.
	require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultFail, Times: 1}))
	r := runner(t, b, fast)

	// The trigger's consume span records the step (pending: the runner is
	// not running), and ends long before any call.
	tctx, trigger := tracing.Start(ctx, "process trip.requested", trace.SpanKindConsumer)
	tr := trip("traced@x.io")
	body, err := hotel.Build("T-tr", tr)
	require.NoError(t, err)
	tx, err := b.pool.Begin(tctx)
	require.NoError(t, err)
	_, err = r.Request(tctx, tx, saga.Request{TripID: "T-tr", Body: body, Carried: sagatest.JSON(t, tr)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(tctx))
	trigger.End()
	var stored string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT traceparent FROM steps WHERE trip_id = 'T-tr'").Scan(&stored))
	require.Equal(t, "00-"+trigger.SpanContext().TraceID().String()+"-"+trigger.SpanContext().SpanID().String()+"-01", stored)

	// The runner, whose context has no trace at all (as after a restart),
	// makes the call and asks again after the 503.
	runUntil(t, r, func() bool { return step(t, b, "T-tr").Status == "done" }, "done after the retry")

	var calls, jobs []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		switch s.Name {
		case "hotel create", "hotel status":
			calls = append(calls, s)
		case "saga hotel forward":
			jobs = append(jobs, s)
		}
	}
	require.GreaterOrEqual(t, len(jobs), 2, "the first call and the retry")
	for _, j := range jobs {
		require.Equal(t, trigger.SpanContext().TraceID(), j.SpanContext.TraceID())
		require.Equal(t, trigger.SpanContext().SpanID(), j.Parent.SpanID(), "each job is a child of the span that asked for the step")
	}
	outcomes := map[string]bool{}
	for _, c := range calls {
		require.Equal(t, trigger.SpanContext().TraceID(), c.SpanContext.TraceID())
		for _, a := range c.Attributes {
			switch a.Key {
			case tracing.KeyIdempotencyKey:
				require.Equal(t, "T-tr:hotel", a.Value.AsString())
			case tracing.KeyOutcome:
				outcomes[a.Value.AsString()] = true
			}
		}
	}
	require.True(t, outcomes["unknown"] && outcomes["done"], "the 503 and the answer after it: %v", outcomes)

	// The undo asked for by a compensation's span runs as its child.
	uctx, comp := tracing.Start(tracing.WithParent(ctx, stored, ""), "process payment.refunded", trace.SpanKindConsumer)
	tx, err = b.pool.Begin(uctx)
	require.NoError(t, err)
	require.NoError(t, r.RequestUndo(uctx, tx, "T-tr"))
	require.NoError(t, tx.Commit(uctx))
	comp.End()
	recoverPass(t, r)
	require.Equal(t, "compensated", step(t, b, "T-tr").Status)
	var undo tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "saga hotel undo" {
			undo = s
		}
	}
	require.Equal(t, comp.SpanContext().SpanID(), undo.Parent.SpanID())
	require.Equal(t, trigger.SpanContext().TraceID(), undo.SpanContext.TraceID())
	testenv.Eventually(t, func() bool {
		for _, s := range exp.GetSpans() {
			if s.Name == "hotel release" && s.Parent.SpanID() == undo.SpanContext.SpanID() {
				return true
			}
		}
		return false
	}, "the release call is a child of the undo")
}
