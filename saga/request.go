package saga

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// Request is a step to do for one trip.
type Request struct {
	TripID string
	// Body is the company request; its sha256 is the request fingerprint.
	Body any
	// Carried is the saga's request (the trip's: an events.TripRequest),
	// as JSON, carried forward in the step's done event so the next
	// step's service needs nothing else; nil carries none. The runner
	// never reads inside it: only the step's [BuildFunc] knows its type.
	Carried json.RawMessage
	// KeyName overrides Spec.KeyName (e.g. "mail:confirmed").
	KeyName string
	// Version is the trip's version (events.VersionExtension), from the
	// event that asked for the step: every event the step publishes
	// carries it on. "" is a trip of before versions (the default order).
	Version string
}

// Request records the step inside tx (the trigger event's inbox
// transaction) and returns whether it was new. A row that exists already,
// including a voided one, is left alone. When ctx comes from
// outbox.WithAfterCommit and Run is running, the row is recorded as
// started and the company is called right after the commit; otherwise it
// is recorded as pending, and the caller calls [Runner.Wake] after commit
// (done for it with outbox.WithAfterCommit).
func (r *Runner) Request(ctx context.Context, tx pgx.Tx, req Request) (bool, error) {
	body, err := json.Marshal(req.Body)
	if err != nil {
		return false, fmt.Errorf("saga: %s body: %w", r.cfg.Spec.Name, err)
	}
	trip := []byte("null")
	if len(req.Carried) > 0 {
		if !json.Valid(req.Carried) {
			return false, fmt.Errorf("saga: %s of %s: the carried request is not JSON", r.cfg.Spec.Name, req.TripID)
		}
		trip = req.Carried
	}
	sum := sha256.Sum256(body)
	tp, ts := traceOf(ctx)
	key := r.Key(req.TripID)
	if req.KeyName != "" {
		key = req.TripID + ":" + req.KeyName
	}
	if rc := r.runCtx.Load(); rc != nil && (*rc).Err() == nil && outbox.InAfterCommit(ctx) {
		// The trigger's transaction takes the claim too: the row is
		// started, with a lease, and the call is made once it commits. A
		// crash before the call leaves a started row, which is asked
		// about again by key like any other.
		row, err := queries.StepInsertStarted(ctx, tx, dbsqlc.StepInsertStartedParams{
			TripID: req.TripID, Step: r.cfg.Spec.Name, IdempotencyKey: key,
			Request: body, Fingerprint: hex.EncodeToString(sum[:]), Trip: trip,
			DeadlineMs: ms(r.t.StepDeadline), LeaseMs: ms(r.leaseFor()), Owner: r.owner(),
			Traceparent: tp, Tracestate: ts, Version: req.Version,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("saga: record %s of %s: %w", r.cfg.Spec.Name, req.TripID, err)
		}
		outbox.AfterCommit(ctx, func() { r.launch(*rc, row) })
		return true, nil
	}
	n, err := queries.StepInsertIfAbsent(ctx, tx, dbsqlc.StepInsertIfAbsentParams{
		TripID: req.TripID, Step: r.cfg.Spec.Name, IdempotencyKey: key,
		Request: body, Fingerprint: hex.EncodeToString(sum[:]), Trip: trip,
		DeadlineMs: ms(r.t.StepDeadline), Traceparent: tp, Tracestate: ts, Version: req.Version,
	})
	if err != nil {
		return false, fmt.Errorf("saga: record %s of %s: %w", r.cfg.Spec.Name, req.TripID, err)
	}
	if n == 1 {
		outbox.AfterCommit(ctx, r.Wake)
	}
	return n == 1, nil
}

// RequestUndo asks, inside tx, for the step of trip to be undone (its
// compensation). A step that is done or still unresolved becomes
// compensating; a step with no row is voided, so it never runs if its
// trigger comes later; a step already rejected, failed, undone or voided is
// left alone. Call [Runner.Wake] after commit (done for the caller when ctx
// comes from outbox.WithAfterCommit).
func (r *Runner) RequestUndo(ctx context.Context, tx pgx.Tx, trip string) error {
	return r.RequestUndoOf(ctx, tx, trip, "")
}

// RequestUndoOf is [Runner.RequestUndo] for a trip of version (the
// version of the event asking for the undo, events.VersionOf): a step
// voided before it ran says so with an event of that version. A row that
// exists keeps the version it was recorded with. A step compensable in
// one order and the pivot in another (step c of a,c,b and of a,b,c) is
// undone only for a trip whose version makes it
// compensable; the pivot has no compensation.
func (r *Runner) RequestUndoOf(ctx context.Context, tx pgx.Tx, trip, version string) error {
	if !r.compensableIn(version) {
		return fmt.Errorf("saga: %s is %s and has no compensation", r.cfg.Spec.Name, r.cfg.Spec.Class)
	}
	outbox.AfterCommit(ctx, r.Wake)
	row, err := queries.StepGetForUpdate(ctx, tx, dbsqlc.StepGetForUpdateParams{TripID: trip, Step: r.cfg.Spec.Name})
	if errors.Is(err, pgx.ErrNoRows) {
		n, err := queries.StepInsertVoided(ctx, tx, dbsqlc.StepInsertVoidedParams{TripID: trip, Step: r.cfg.Spec.Name, IdempotencyKey: r.Key(trip), Version: version})
		if err != nil {
			return fmt.Errorf("saga: void %s of %s: %w", r.cfg.Spec.Name, trip, err)
		}
		if n == 0 {
			// The trigger's transaction recorded the step while we waited
			// on its row: undo that row instead.
			row, err = queries.StepGetForUpdate(ctx, tx, dbsqlc.StepGetForUpdateParams{TripID: trip, Step: r.cfg.Spec.Name})
			if err != nil {
				return fmt.Errorf("saga: undo %s of %s: %w", r.cfg.Spec.Name, trip, err)
			}
			return r.undoRow(ctx, tx, row)
		}
		// Nothing happened, so the undo is done at once; say so, or the
		// step before this one would never be undone.
		voided, err := queries.StepGetForUpdate(ctx, tx, dbsqlc.StepGetForUpdateParams{TripID: trip, Step: r.cfg.Spec.Name})
		if err != nil {
			return err
		}
		voided.Reason = new("voided: the undo came before the step")
		evs, err := r.event(r.cfg.Spec.OnUndone, &voided, false)
		if err != nil {
			return err
		}
		return r.write(ctx, tx, evs...)
	}
	if err != nil {
		return fmt.Errorf("saga: undo %s of %s: %w", r.cfg.Spec.Name, trip, err)
	}
	return r.undoRow(ctx, tx, row)
}

// compensableIn reports whether the runner's step has a compensation in
// a trip of version: a compensable Spec always; a pivot Spec when the
// version's catalogue (Config.Family) makes the step compensable and the
// Spec names its undo's event.
func (r *Runner) compensableIn(version string) bool {
	switch r.cfg.Spec.Class {
	case events.Compensable:
		return true
	case events.Pivot:
		if r.cfg.Family == nil || r.cfg.Spec.OnUndone == "" {
			return false
		}
		c, err := r.cfg.Family.Of(version)
		if err != nil {
			return false
		}
		st, ok := c.Step(r.cfg.Spec.Name)
		return ok && st.Compensation != nil
	}
	return false
}

func (r *Runner) undoRow(ctx context.Context, tx pgx.Tx, row dbsqlc.Step) error {
	switch Status(row.Status) {
	case Done, Pending, Unknown, Started:
		if Status(row.Status) != Started { // a call in flight keeps its lease
			now, err := r.dbNow(ctx, tx)
			if err != nil {
				return err
			}
			row.NextAttemptAt = now
		}
		row.Status = string(Compensating)
		row.UndoCause = new(CauseCompensation)
		// The undo's calls belong to the compensation's span from now on.
		if tp, ts := traceOf(ctx); tp != nil {
			row.Traceparent, row.Tracestate = tp, ts
		}
		return update(ctx, tx, row)
	default:
		return nil
	}
}
