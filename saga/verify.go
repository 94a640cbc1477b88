package saga

import (
	"context"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// verify asks the company again about an undone step, in case it committed
// late, and undoes it again if it did. An answer that is unknown or breaks
// the contract (see provider.ErrUnknownOutcome) decides nothing: the
// question is asked again after VerifyAfter/2.
func (r *Runner) verify(ctx context.Context, claimed dbsqlc.Step) {
	if r.fenced("verify", &claimed) {
		return
	}
	ctx, span := r.startSpan(ctx, "verify", &claimed)
	defer span.End()
	res, callErr := r.call(ctx, "status", func(ctx context.Context) (provider.Result, error) {
		return r.cfg.Spec.Company.Status(ctx, claimed.IdempotencyKey)
	})
	if ctx.Err() != nil {
		return
	}
	err := r.inTx(ctx, claimed, func(tx pgx.Tx, row *dbsqlc.Step) ([]event.Event, error) {
		now, err := r.dbNow(ctx, tx)
		if err != nil {
			return nil, err
		}
		if callErr != nil {
			// Unknown, or an answer that breaks the contract: never taken
			// as "nothing there"; asked again.
			r.log.Warn("saga: verification unanswered; will ask again by key", "trip_id", row.TripID, "key", row.IdempotencyKey, "err", callErr)
			v := now.Add(r.t.VerifyAfter / 2)
			row.VerifyAt = &v
			return nil, nil //nolint:nilerr // callErr is the company's, handled here: asked again later
		}
		row.VerifyAt = nil
		undoneAt := now
		if row.UndoneAt != nil {
			undoneAt = *row.UndoneAt
		}
		if elapsed := now.Sub(undoneAt); res.Outcome != provider.Done && elapsed < r.t.VerifyHorizon {
			// Still nothing; a company may commit later yet: ask again,
			// each time after as long again as has passed (at most 10 min).
			v := now.Add(min(max(r.t.VerifyAfter, elapsed), 10*time.Minute))
			row.VerifyAt = &v
		}
		if res.Outcome == provider.Done && res.Status == r.cfg.Spec.ActiveStatus {
			r.log.Warn("saga: company committed after our undo; undoing again", "trip_id", row.TripID, "key", row.IdempotencyKey)
			row.Status = string(Compensating)
			row.Outcome = new("late commit found: " + res.Status)
			row.NextAttemptAt = now
			if res.Ref != "" {
				row.CompanyRef = &res.Ref
			}
		}
		return nil, nil
	})
	if err != nil {
		r.log.Error("saga: cannot record verification", "trip_id", claimed.TripID, "err", err)
	}
}
