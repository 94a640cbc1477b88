package saga

import (
	"context"
	"fmt"
	"time"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// releaseDead ends the leases of the service's dead replicas (see
// [Liveness]): now when force, else at most once per BeatInterval.
func (r *Runner) releaseDead(ctx context.Context, force bool) error {
	l := r.cfg.Liveness
	if l.ID() == 0 {
		return nil
	}
	now := time.Now().UnixNano()
	if last := r.lastRelease.Load(); !force && now-last < int64(BeatInterval) {
		return nil
	}
	r.lastRelease.Store(now)
	if _, err := l.ReleaseDeadLeases(ctx); err != nil {
		return err
	}
	return nil
}

// leaseFor is how long a claim's lease lasts: a job makes up to two calls
// (the call, then a status by key), each at most CallTimeout, plus 1 s.
func (r *Runner) leaseFor() time.Duration { return 2*r.t.CallTimeout + time.Second }

// owner is the id leases taken by this runner carry (nil without Liveness).
func (r *Runner) owner() *int32 {
	if id := r.cfg.Liveness.ID(); id != 0 {
		return &id
	}
	return nil
}

// claim takes up to max due rows in one transaction, writes each one's new
// state (started with attempts+1, or compensating with undo_attempts+1)
// with a lease owned by this process, commits, and returns the calls to
// make. verifyNow looks for undone rows to verify whatever the time since
// the last look.
func (r *Runner) claim(ctx context.Context, max int, verifyNow bool) ([]func(context.Context), error) {
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := queries.StepClaimDue(ctx, tx, dbsqlc.StepClaimDueParams{Step: r.cfg.Spec.Name, Max: int32(max)})
	if err != nil {
		return nil, fmt.Errorf("claim due: %w", err)
	}
	if rows, err = r.skipPaused(ctx, tx, rows, false); err != nil {
		return nil, err
	}
	// The transaction's now(), which StepClaimDue compared with: every
	// decision and lease of the claim is by the database's clock.
	now, err := r.dbNow(ctx, tx)
	if err != nil {
		return nil, err
	}
	// A job makes up to two calls (the call, then a status by key).
	// PostgreSQL keeps microseconds: a lease written as it will be read
	// back lets StepUpdate recognise the row (only_if_unchanged).
	lease := now.Add(r.leaseFor()).Truncate(time.Microsecond)
	owner := r.owner()
	var jobs []func(context.Context)
	for _, row := range rows {
		row.Owner = owner
		switch Status(row.Status) {
		case Pending, Started, Unknown:
			if r.cfg.Spec.Class != events.ForwardOnly && row.Attempts > 0 && !now.Before(row.DeadlineAt) {
				// Unknown by the deadline: undo by key.
				row.Status = string(Compensating)
				row.UndoCause = new(CauseDeadline)
				row.Outcome = new(fmt.Sprintf("still unknown at the deadline after %d calls", row.Attempts))
				r.log.Warn("saga: outcome unknown at deadline; undoing by key", "trip_id", row.TripID, "key", row.IdempotencyKey)
				row.UndoAttempts++
				row.NextAttemptAt = lease
				claimed := row
				jobs = append(jobs, func(ctx context.Context) { r.undo(ctx, claimed) })
				break
			}
			row.Status = string(Started)
			row.Attempts++
			if row.StartedAt == nil {
				row.StartedAt = &now
			}
			row.NextAttemptAt = lease
			claimed := row
			jobs = append(jobs, func(ctx context.Context) { r.forward(ctx, claimed) })
		case Compensating:
			row.UndoAttempts++
			row.NextAttemptAt = lease
			claimed := row
			jobs = append(jobs, func(ctx context.Context) { r.undo(ctx, claimed) })
		}
		if err := update(ctx, tx, row); err != nil {
			return nil, err
		}
	}
	if now := time.Now(); len(jobs) < max && (verifyNow || now.UnixNano()-r.lastVerify.Load() >= int64(r.t.PollInterval)) {
		r.lastVerify.Store(now.UnixNano())
		vrows, err := queries.StepClaimVerify(ctx, tx, dbsqlc.StepClaimVerifyParams{Step: r.cfg.Spec.Name, Max: int32(max - len(jobs))})
		if err != nil {
			return nil, fmt.Errorf("claim verify: %w", err)
		}
		if vrows, err = r.skipPaused(ctx, tx, vrows, true); err != nil {
			return nil, err
		}
		for _, row := range vrows {
			row.VerifyAt = &lease
			row.Owner = owner
			if err := update(ctx, tx, row); err != nil {
				return nil, err
			}
			claimed := row
			jobs = append(jobs, func(ctx context.Context) { r.verify(ctx, claimed) })
		}
	}
	if len(jobs) < max {
		inMs, err := queries.StepNextDue(ctx, tx, r.cfg.Spec.Name)
		if err != nil {
			return nil, fmt.Errorf("claim next due: %w", err)
		}
		// The database says in how long; the sleep is timed locally.
		r.nextDue.Store(time.Now().Add(time.Duration(inMs * float64(time.Millisecond))).UnixNano())
	} else {
		r.nextDue.Store(0)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("claim commit: %w", err)
	}
	return jobs, nil
}
