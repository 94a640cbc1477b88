package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// inTx locks the row, lets f change it and name events, writes both, and
// commits.
func (r *Runner) inTx(ctx context.Context, claimed dbsqlc.Step, f func(tx pgx.Tx, row *dbsqlc.Step) ([]event.Event, error)) error {
	// Most often the row is still as claimed: write the answer without
	// reading it first, and read it only if it changed meanwhile.
	if done, err := r.inTxAsClaimed(ctx, claimed, f); done || err != nil {
		return err
	}
	return r.uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		row, err := queries.StepGetForUpdate(ctx, tx, dbsqlc.StepGetForUpdateParams{TripID: claimed.TripID, Step: claimed.Step})
		if err != nil {
			return err
		}
		evs, err := f(tx, &row)
		if err != nil {
			return err
		}
		r.endLease(&row)
		if err := update(ctx, tx, row); err != nil {
			return err
		}
		return r.write(ctx, tx, evs...)
	})
}

// inTxAsClaimed is inTx on the row as claimed, written only if it is
// still so (updateIf); it reports false, having changed
// nothing, when the row changed meanwhile.
func (r *Runner) inTxAsClaimed(ctx context.Context, claimed dbsqlc.Step, f func(tx pgx.Tx, row *dbsqlc.Step) ([]event.Event, error)) (bool, error) {
	err := r.uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		row := claimed
		evs, err := f(tx, &row)
		if err != nil {
			return err
		}
		r.endLease(&row)
		wrote, err := updateIf(ctx, tx, row, &claimed)
		if err != nil {
			return err
		}
		if !wrote {
			return errRowChanged
		}
		return r.write(ctx, tx, evs...)
	})
	if errors.Is(err, errRowChanged) {
		return false, nil
	}
	return err == nil, err
}

// errRowChanged rolls back inTxAsClaimed's transaction: the row is no
// longer as claimed.
var errRowChanged = errors.New("saga: the step row changed since its claim")

// endLease clears the owner of a row whose call's answer this runner
// writes: no call of it is in flight any more. A lease another replica
// took meanwhile is left as it is.
func (r *Runner) endLease(row *dbsqlc.Step) {
	if row.Owner != nil && *row.Owner == r.cfg.Liveness.ID() {
		row.Owner = nil
	}
}

func (r *Runner) event(typ string, row *dbsqlc.Step, carryTrip bool) ([]event.Event, error) {
	return r.eventBy(typ, row, carryTrip, "")
}

// eventBy is [Runner.event] of a step an operator settled by hand
// (settledBy names them; "" when the company answered).
func (r *Runner) eventBy(typ string, row *dbsqlc.Step, carryTrip bool, settledBy string) ([]event.Event, error) {
	if typ == "" {
		return nil, nil
	}
	d := events.StepData{TripID: row.TripID, Step: row.Step, IdempotencyKey: row.IdempotencyKey, SettledBy: settledBy}
	if row.CompanyRef != nil {
		d.CompanyRef = *row.CompanyRef
	}
	if row.Reason != nil {
		d.Reason = *row.Reason
	}
	if carryTrip && len(row.Trip) > 0 && string(row.Trip) != "null" {
		d.Request = json.RawMessage(row.Trip)
	}
	e, err := events.New(events.Source(r.cfg.Spec.Service), typ, row.TripID, d)
	if err != nil {
		return nil, err
	}
	// The trip's version goes on with every event of the step, so the
	// services after it react by the trip's catalogue (events.VersionOf).
	events.SetVersion(&e, row.Version)
	return []event.Event{e}, nil
}

func (r *Runner) raise(ctx context.Context, tx pgx.Tx, row *dbsqlc.Step, kind string, attempts int, lastErr string) error {
	inserted, err := queries.IncidentRaise(ctx, tx, dbsqlc.IncidentRaiseParams{
		TripID: row.TripID, Step: row.Step, Kind: kind, Attempts: int32(attempts), LastError: lastErr,
	})
	if err != nil {
		return fmt.Errorf("saga: raise incident: %w", err)
	}
	if inserted {
		r.raised.Inc()
		r.log.Error("saga: INCIDENT raised for a person; retries go on", "incident", kind, "trip_id", row.TripID, "key", row.IdempotencyKey, "attempts", attempts, "last_error", lastErr)
	}
	return nil
}

// raiseStuck raises the incident kind of an undo that is stuck (past
// IncidentAfter attempts) or refused for good, and returns, when this call
// raised it, the step's stuck event (Spec.OnStuck, e.g.
// charge.refund_stuck; see events.Compensation.Stuck), written in the
// same transaction: the step before is undone on it while this undo goes
// on retrying, so one stuck undo does not hold up the others. An
// operator's undo of a leaked record (CauseOperator) belongs to no
// running saga and publishes none.
func (r *Runner) raiseStuck(ctx context.Context, tx pgx.Tx, row *dbsqlc.Step, kind, lastErr string) ([]event.Event, error) {
	inserted, err := queries.IncidentRaise(ctx, tx, dbsqlc.IncidentRaiseParams{
		TripID: row.TripID, Step: row.Step, Kind: kind, Attempts: row.UndoAttempts, LastError: lastErr,
	})
	if err != nil {
		return nil, fmt.Errorf("saga: raise incident: %w", err)
	}
	if !inserted {
		return nil, nil
	}
	r.raised.Inc()
	r.log.Error("saga: INCIDENT raised for a person; retries go on", "incident", kind, "trip_id", row.TripID, "key", row.IdempotencyKey, "attempts", row.UndoAttempts, "last_error", lastErr)
	if row.UndoCause != nil && *row.UndoCause == CauseOperator {
		return nil, nil
	}
	if r.cfg.Spec.OnStuck != "" {
		r.log.Warn("saga: the undo is stuck; the steps before it are undone meanwhile, and it goes on retrying", "trip_id", row.TripID, "key", row.IdempotencyKey, "event", r.cfg.Spec.OnStuck)
	}
	return r.event(r.cfg.Spec.OnStuck, row, false)
}

func update(ctx context.Context, tx pgx.Tx, row dbsqlc.Step) error {
	_, err := updateIf(ctx, tx, row, nil)
	return err
}

// updateIf writes row; with was set, only if the stored row is still as
// was (StepUpdate's only_if_unchanged), and reports whether it wrote.
func updateIf(ctx context.Context, tx pgx.Tx, row dbsqlc.Step, was *dbsqlc.Step) (bool, error) {
	p := dbsqlc.StepUpdateParams{
		TripID: row.TripID, Step: row.Step, Status: row.Status, UndoCause: row.UndoCause,
		CompanyRef: row.CompanyRef, Outcome: row.Outcome, Reason: row.Reason,
		Attempts: row.Attempts, UndoAttempts: row.UndoAttempts, NextAttemptAt: row.NextAttemptAt,
		VerifyAt: row.VerifyAt, LastError: row.LastError, StartedAt: row.StartedAt,
		FinishedAt: row.FinishedAt, UndoneAt: row.UndoneAt, Owner: row.Owner,
		Traceparent: row.Traceparent, Tracestate: row.Tracestate,
	}
	if was != nil {
		p.OnlyIfUnchanged = true
		p.WasStatus, p.WasAttempts, p.WasUndoAttempts, p.WasVerifyAt = was.Status, was.Attempts, was.UndoAttempts, was.VerifyAt
	}
	n, err := queries.StepUpdate(ctx, tx, p)
	if err != nil {
		return false, fmt.Errorf("saga: update %s of %s: %w", row.Step, row.TripID, err)
	}
	return n == 1, nil
}
