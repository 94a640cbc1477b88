package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// forward calls the company for a claimed row (status started) and records
// the answer.
func (r *Runner) forward(ctx context.Context, claimed dbsqlc.Step) {
	if r.fenced("forward", &claimed) || !r.leaseCovers(ctx, &claimed) {
		return
	}
	ctx, span := r.startSpan(ctx, "forward", &claimed)
	defer span.End()
	ctx = fault.WithSite(ctx, r.cfg.Spec.Service, r.cfg.Spec.Name, false, claimed.TripID) // fault points <service>.<op>.<where>
	var body json.RawMessage = claimed.Request
	res, callErr := r.call(ctx, "do", func(ctx context.Context) (provider.Result, error) {
		return r.cfg.Spec.Company.Create(ctx, claimed.IdempotencyKey, body)
	})
	if callErr != nil && ctx.Err() == nil {
		res, callErr = r.learnForward(ctx, claimed.IdempotencyKey, body, res, callErr)
	}
	if ctx.Err() != nil {
		return // shutting down: the lease expires and the recovery pass asks again
	}
	if fault.HitSite(ctx, fault.AfterCall) != nil {
		return // as if the answer could not be recorded: asked again by key
	}
	err := r.inTx(ctx, claimed, func(tx pgx.Tx, row *dbsqlc.Step) ([]event.Event, error) {
		if Status(row.Status) != Started || row.Attempts != claimed.Attempts {
			// Undo was asked for meanwhile: keep what we learned.
			if callErr == nil && res.Outcome == provider.Done && res.Ref != "" {
				row.CompanyRef = &res.Ref
			}
			return nil, nil
		}
		now, err := r.dbNow(ctx, tx)
		if err != nil {
			return nil, err
		}
		if callErr != nil {
			row.Status = string(Unknown)
			row.LastError = new(callErr.Error())
			row.Outcome = new("unknown")
			next := now.Add(backoff(row.Attempts, r.t.RetryBackoffMin, r.t.RetryBackoffMax))
			if r.cfg.Spec.Class != events.ForwardOnly && next.After(row.DeadlineAt) {
				next = row.DeadlineAt
			}
			row.NextAttemptAt = next
			r.log.Info("saga: outcome unknown; will ask again by key", "trip_id", row.TripID, "key", row.IdempotencyKey, "attempt", row.Attempts, "err", callErr)
			// A company that answers about another key or amount, or
			// refuses our credentials, will not answer better when asked
			// again: a person is told at once, and the asking goes on.
			var mismatch *provider.MismatchError
			if errors.As(callErr, &mismatch) {
				if err := r.raise(ctx, tx, row, IncidentForwardAnswerMismatch, int(row.Attempts), callErr.Error()); err != nil {
					return nil, err
				}
			}
			var creds *provider.CredentialsError
			if errors.As(callErr, &creds) {
				if err := r.raise(ctx, tx, row, IncidentCompanyCredentials, int(row.Attempts), callErr.Error()); err != nil {
					return nil, err
				}
			}
			if r.cfg.Spec.Class == events.ForwardOnly && int(row.Attempts) >= r.t.IncidentAfter {
				return nil, r.raise(ctx, tx, row, IncidentForwardStuck, int(row.Attempts), callErr.Error())
			}
			return nil, nil
		}
		if row.LastError != nil {
			// An earlier attempt was unknown and may have raised an
			// incident: the step settles on a good answer now.
			if err := queries.IncidentResolve(ctx, tx, dbsqlc.IncidentResolveParams{TripID: row.TripID, Step: row.Step}); err != nil {
				return nil, err
			}
		}
		row.Outcome = new(fmt.Sprintf("%d %s", res.Code, res.Status))
		row.FinishedAt = &now
		row.LastError = nil
		switch res.Outcome {
		case provider.Done:
			row.Status = string(Done)
			row.CompanyRef = &res.Ref
			return r.event(r.cfg.Spec.OnDone, row, true)
		default:
			row.Status = string(Rejected)
			row.Reason = &res.Reason
			if r.cfg.Spec.Class == events.ForwardOnly {
				if err := r.raise(ctx, tx, row, IncidentForwardRefused, int(row.Attempts), res.Reason); err != nil {
					return nil, err
				}
			}
			return r.event(r.cfg.Spec.OnRejected, row, false)
		}
	})
	if err != nil {
		r.log.Error("saga: cannot record answer; the recovery pass will ask again by key", "trip_id", claimed.TripID, "err", err)
	}
	if callErr != nil {
		// Asked again after the backoff just written: the runner, which
		// may be sleeping until a later row, reads when that is.
		r.Wake()
	}
}

// learnForward asks the company's status by key (GET /<resource>/{key})
// after a forward call whose outcome is unknown: a resource in force means
// the step happened; a record of a rejection (Spec.RejectedStatus: a
// declined charge) is a rejection; anything else stays
// unknown and the same request is sent again later. The status is checked
// against body when the company is a [StatusChecker] (a charge answered
// with another amount is not in force for us). A status that fails is
// joined to callErr, so a mismatch or a credentials refusal met on either
// call raises its incident.
func (r *Runner) learnForward(ctx context.Context, key string, body any, res provider.Result, callErr error) (provider.Result, error) {
	st, err := r.call(ctx, "status", func(ctx context.Context) (provider.Result, error) {
		if sc, ok := r.cfg.Spec.Company.(StatusChecker); ok {
			return sc.StatusFor(ctx, key, body)
		}
		return r.cfg.Spec.Company.Status(ctx, key)
	})
	switch {
	case err != nil:
		return res, fmt.Errorf("%w; asked by key: %w", callErr, err)
	case st.Outcome != provider.Done:
		return res, callErr
	case st.Status == r.cfg.Spec.ActiveStatus:
		return st, nil
	case st.Status != "" && st.Status == r.cfg.Spec.RejectedStatus:
		return provider.Result{Outcome: provider.Rejected, Code: st.Code, Status: st.Status, Reason: r.cfg.Spec.RejectedReason}, nil
	}
	return res, callErr
}
