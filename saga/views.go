package saga

import (
	"context"
	"fmt"
	"time"

	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// Incident is a problem raised for a person (the Incident kinds of this
// package: compensation_stuck, compensation_refused, forward_stuck,
// forward_refused, forward_answer_mismatch, compensation_answer_mismatch,
// company_credentials). Retries go on while it is open.
type Incident struct {
	TripID string `json:"trip_id"`
	Step   string `json:"step"`
	Kind   string `json:"kind"`
	// Attempts is the calls made when it was raised (or last refreshed);
	// AttemptsNow those its step (its undo, for an undo's incident) has
	// made now, as the step log says.
	Attempts    int        `json:"attempts"`
	AttemptsNow int        `json:"attempts_now"`
	LastError   string     `json:"last_error"`
	RaisedAt    time.Time  `json:"raised_at"`
	ResolvedAt  *time.Time `json:"resolved_at,omitempty"`
	// ResolvedBy and Resolution say who resolved it and why, when an
	// operator did (events.ActionResolve).
	ResolvedBy string `json:"resolved_by,omitempty"`
	Resolution string `json:"resolution,omitempty"`
	// Owner is who answers for it (the service's INCIDENT_OWNER, or the
	// service's name) and EscalatesAt when an open one escalates past
	// them (raised_at + INCIDENT_ESCALATE_AFTER_MS), Escalated whether it
	// has, by the database's clock. Set by the service's GET /incidents.
	Owner       string     `json:"owner,omitempty"`
	EscalatesAt *time.Time `json:"escalates_at,omitempty"`
	Escalated   bool       `json:"escalated,omitempty"`
}

// Incidents lists every incident of the service whose schema db reaches,
// oldest first.
func Incidents(ctx context.Context, db dbsqlc.DBTX) ([]Incident, error) {
	rows, err := queries.IncidentListAll(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("saga: incidents: %w", err)
	}
	out := make([]Incident, 0, len(rows))
	for _, r := range rows {
		inc := Incident{TripID: r.TripID, Step: r.Step, Kind: r.Kind, Attempts: int(r.Attempts), AttemptsNow: int(r.AttemptsNow),
			LastError: r.LastError, RaisedAt: r.RaisedAt.UTC(), ResolvedAt: r.ResolvedAt}
		if r.ResolvedBy != nil {
			inc.ResolvedBy = *r.ResolvedBy
		}
		if r.Resolution != nil {
			inc.Resolution = *r.Resolution
		}
		out = append(out, inc)
	}
	return out, nil
}

// Calls returns the calls its step has made by now: AttemptsNow, or
// Attempts from a service that does not give it.
func (in Incident) Calls() int { return max(in.AttemptsNow, in.Attempts) }

// StepView is a step log row, for operators.
type StepView struct {
	TripID         string     `json:"trip_id"`
	Step           string     `json:"step"`
	IdempotencyKey string     `json:"idempotency_key"`
	Status         string     `json:"status"`
	UndoCause      string     `json:"undo_cause,omitempty"`
	CompanyRef     string     `json:"company_ref,omitempty"`
	Outcome        string     `json:"outcome,omitempty"`
	Reason         string     `json:"reason,omitempty"`
	Attempts       int        `json:"attempts"`
	UndoAttempts   int        `json:"undo_attempts"`
	LastError      string     `json:"last_error,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	FinishedAt     *time.Time `json:"finished_at,omitempty"`
	UndoneAt       *time.Time `json:"undone_at,omitempty"`
}

// Steps returns the step log rows of a trip.
func Steps(ctx context.Context, db dbsqlc.DBTX, trip string) ([]StepView, error) {
	rows, err := queries.StepListByTrip(ctx, db, trip)
	if err != nil {
		return nil, fmt.Errorf("saga: steps of %s: %w", trip, err)
	}
	s := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	out := make([]StepView, 0, len(rows))
	for _, r := range rows {
		out = append(out, StepView{
			TripID: r.TripID, Step: r.Step, IdempotencyKey: r.IdempotencyKey, Status: r.Status, UndoCause: s(r.UndoCause),
			CompanyRef: s(r.CompanyRef), Outcome: s(r.Outcome), Reason: s(r.Reason), Attempts: int(r.Attempts),
			UndoAttempts: int(r.UndoAttempts), LastError: s(r.LastError), CreatedAt: r.CreatedAt.UTC(), FinishedAt: r.FinishedAt, UndoneAt: r.UndoneAt,
		})
	}
	return out, nil
}
