package saga

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tripsaga/tripsaga/internal/tracing"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// call makes one company call with its deadline CallTimeout from now, or
// none, returning [ErrFenced], once this process is fenced: a call started
// before the fence ends by the fence + CallTimeout, before any peer may
// take the row (see [FenceAfter]).
func (r *Runner) call(ctx context.Context, op string, f func(context.Context) (provider.Result, error)) (provider.Result, error) {
	now := time.Now()
	if at, ok := r.cfg.Liveness.FenceAt(); ok && !now.Before(at) {
		r.calls.WithLabelValues(op, "fenced").Inc()
		return provider.Result{}, ErrFenced
	}
	cctx, cancel := context.WithDeadline(ctx, now.Add(r.t.CallTimeout))
	defer cancel()
	res, err := f(cctx)
	outcome := string(res.Outcome)
	if err != nil {
		outcome = "unknown"
	}
	r.calls.WithLabelValues(op, outcome).Inc()
	return res, err
}

// startSpan starts the span of a job on a claimed row ("saga <step>
// <job>": forward, undo, verify) as a child of the trace context stored
// with the row (the span that asked for the step or its undo), so calls
// made later from the step log (the runner, retries, the recovery pass)
// belong to the trip's trace. A no-op span while tracing is off.
func (r *Runner) startSpan(ctx context.Context, job string, row *dbsqlc.Step) (context.Context, trace.Span) {
	if !tracing.Enabled() {
		return ctx, noop.Span{}
	}
	ctx = tracing.WithParentPtr(ctx, row.Traceparent, row.Tracestate)
	return tracing.Start(ctx, "saga "+r.cfg.Spec.Name+" "+job, trace.SpanKindInternal,
		tracing.KeyTripID.String(row.TripID), tracing.KeyStep.String(row.Step),
		tracing.KeyService.String(r.cfg.Spec.Service), tracing.KeyIdempotencyKey.String(row.IdempotencyKey),
		attribute.String("tripsaga.step.status", row.Status),
		attribute.Int("tripsaga.step.attempts", int(row.Attempts)), attribute.Int("tripsaga.step.undo_attempts", int(row.UndoAttempts)))
}

// traceOf is the trace context of ctx's span, as the step row stores it
// (nil while tracing is off).
func traceOf(ctx context.Context) (traceparent, tracestate *string) {
	tp, ts := tracing.Traceparent(ctx)
	if tp == "" {
		return nil, nil
	}
	traceparent = &tp
	if ts != "" {
		tracestate = &ts
	}
	return traceparent, tracestate
}

// leaseCovers reports whether what is left of a claimed row's lease covers
// the job's calls (up to two, each at most CallTimeout). A job that waited
// for a call slot past that renews the lease first, only if the row is
// still as claimed; when it is not (its lease ran out and another process,
// or this one, took the row, or an undo was asked for) the call is not
// made, so no two calls of one key are ever in flight.
//
// The lease is the database's time; what is left of it is judged by the
// database's clock as this runner last read it (dbClock: never later than
// the database's), and the renewed lease is the database's now() plus the
// lease.
func (r *Runner) leaseCovers(ctx context.Context, claimed *dbsqlc.Step) bool {
	if now, known := r.clock.estimate(); known && claimed.NextAttemptAt.Sub(now) >= 2*r.t.CallTimeout+250*time.Millisecond {
		return true
	}
	lease, err := queries.StepRenewLease(ctx, r.cfg.Pool, dbsqlc.StepRenewLeaseParams{
		TripID: claimed.TripID, Step: claimed.Step, Status: claimed.Status,
		Attempts: claimed.Attempts, UndoAttempts: claimed.UndoAttempts,
		WasLease: claimed.NextAttemptAt, LeaseMs: ms(r.leaseFor()),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err != nil || lease.IsZero() {
		r.log.Info("saga: a claimed call waited past its lease and the row changed meanwhile; not calling", "trip_id", claimed.TripID, "key", claimed.IdempotencyKey, "err", err)
		return false
	}
	claimed.NextAttemptAt = lease
	return true
}

// fenced reports, and logs, that a claimed job is abandoned because this
// process is fenced: nothing is called or written; the row's lease runs
// out, or a peer takes it after [Liveness.TakeoverAfter].
func (r *Runner) fenced(job string, claimed *dbsqlc.Step) bool {
	if !r.cfg.Liveness.Fenced() {
		return false
	}
	op := map[string]string{"forward": "do", "undo": "undo", "verify": "status"}[job]
	r.calls.WithLabelValues(op, "fenced").Inc()
	r.log.Warn("saga: fenced (liveness not confirmed): abandoning a claimed call; its lease runs out or a peer takes it", "job", job, "trip_id", claimed.TripID, "key", claimed.IdempotencyKey)
	return true
}
