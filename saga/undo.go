package saga

import (
	"context"
	"errors"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// learnUndo asks the company's status by key after an undo whose outcome is
// unknown: no record, or a record no longer in force, means the undo is
// done (a record that appears later is caught by the verification). A
// status that fails is joined to callErr.
func (r *Runner) learnUndo(ctx context.Context, key string, res provider.Result, callErr error) (provider.Result, error) {
	st, err := r.call(ctx, "status", func(ctx context.Context) (provider.Result, error) {
		return r.cfg.Spec.Company.Status(ctx, key)
	})
	switch {
	case err != nil:
		return res, fmt.Errorf("%w; asked by key: %w", callErr, err)
	case st.Outcome == provider.None:
		return provider.Result{Outcome: provider.None, Code: st.Code, Status: "none"}, nil
	case st.Status != r.cfg.Spec.ActiveStatus:
		return provider.Result{Outcome: provider.Undone, Code: st.Code, Status: st.Status, Ref: st.Ref}, nil
	}
	return res, callErr
}

// undo calls the company's undo by key for a claimed compensating row.
func (r *Runner) undo(ctx context.Context, claimed dbsqlc.Step) {
	if r.fenced("undo", &claimed) || !r.leaseCovers(ctx, &claimed) {
		return
	}
	ctx, span := r.startSpan(ctx, "undo", &claimed)
	defer span.End()
	ctx = fault.WithSite(ctx, r.cfg.Spec.Service, r.cfg.Spec.Name, true, claimed.TripID)
	res, callErr := r.call(ctx, "undo", func(ctx context.Context) (provider.Result, error) {
		return r.cfg.Spec.Company.Undo(ctx, claimed.IdempotencyKey)
	})
	if callErr != nil && ctx.Err() == nil {
		res, callErr = r.learnUndo(ctx, claimed.IdempotencyKey, res, callErr)
	}
	if ctx.Err() != nil {
		return
	}
	if fault.HitSite(ctx, fault.AfterCall) != nil {
		return // as if the answer could not be recorded: retried by key
	}
	err := r.inTx(ctx, claimed, func(tx pgx.Tx, row *dbsqlc.Step) ([]event.Event, error) {
		if Status(row.Status) != Compensating || row.UndoAttempts != claimed.UndoAttempts {
			return nil, nil
		}
		now, err := r.dbNow(ctx, tx)
		if err != nil {
			return nil, err
		}
		var refused *provider.RefusedError
		if errors.As(callErr, &refused) {
			// A definitive answer, not an unknown one: say so at once and
			// ask again only rarely, until a person acts.
			row.LastError = new(callErr.Error())
			row.NextAttemptAt = now.Add(r.t.UndoBackoffMax)
			r.log.Error("saga: the company refused the undo; retrying at the longest backoff until a person acts", "trip_id", row.TripID, "key", row.IdempotencyKey, "attempt", row.UndoAttempts, "err", callErr)
			return r.raiseStuck(ctx, tx, row, IncidentCompensationRefused, callErr.Error())
		}
		if callErr != nil {
			row.LastError = new(callErr.Error())
			row.NextAttemptAt = now.Add(backoff(row.UndoAttempts, r.t.UndoBackoffMin, r.t.UndoBackoffMax))
			r.log.Warn("saga: undo failed; will retry", "trip_id", row.TripID, "key", row.IdempotencyKey, "attempt", row.UndoAttempts, "err", callErr)
			var mismatch *provider.MismatchError
			if errors.As(callErr, &mismatch) {
				// Never taken as undone; asking again will not fix it.
				if err := r.raise(ctx, tx, row, IncidentCompensationAnswerMismatch, int(row.UndoAttempts), callErr.Error()); err != nil {
					return nil, err
				}
			}
			if int(row.UndoAttempts) >= r.t.IncidentAfter {
				return r.raiseStuck(ctx, tx, row, IncidentCompensationStuck, callErr.Error())
			}
			return nil, nil
		}
		row.UndoneAt = &now
		row.LastError = nil
		row.Outcome = new(fmt.Sprintf("undo: %d %s", res.Code, res.Status))
		if res.Outcome == provider.None && row.Attempts > 0 && row.VerifyAt == nil {
			// The company never saw the key, but an earlier call may still
			// commit late: ask again later.
			v := now.Add(r.t.VerifyAfter)
			row.VerifyAt = &v
		}
		if err := queries.IncidentResolve(ctx, tx, dbsqlc.IncidentResolveParams{TripID: row.TripID, Step: row.Step}); err != nil {
			return nil, err
		}
		if row.UndoCause != nil && *row.UndoCause == CauseOperator {
			// An operator's undo of a leaked record: the trip settled long
			// ago; the action event and the operator log are the record.
			row.Status = string(Compensated)
			return nil, nil
		}
		if row.UndoCause != nil && *row.UndoCause == CauseDeadline {
			row.Status = string(Failed)
			return r.event(r.cfg.Spec.OnFailed, row, false)
		}
		row.Status = string(Compensated)
		return r.event(r.cfg.Spec.OnUndone, row, false)
	})
	if err != nil {
		r.log.Error("saga: cannot record undo; it will be retried by key", "trip_id", claimed.TripID, "err", err)
	}
	if callErr != nil {
		r.Wake() // retried after the backoff just written (see forward)
	}
}
