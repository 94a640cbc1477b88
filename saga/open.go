package saga

import (
	"context"
	"fmt"
	"time"

	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// OpenStep is a step log row that is not final: the recovery pass still
// owes it work (pending, started, unknown, compensating). Attempts are
// its forward calls, UndoAttempts its undo's; Since is when the row took
// its Status (status_since, the database's clock).
type OpenStep struct {
	TripID       string    `json:"trip_id"`
	Step         string    `json:"step"`
	Status       string    `json:"status"`
	Attempts     int       `json:"attempts"`
	UndoAttempts int       `json:"undo_attempts"`
	LastError    string    `json:"last_error,omitempty"`
	Since        time.Time `json:"since"`
	// Paused: an operator paused the trip's company calls at this
	// service (events.ActionPause); its runner claims none of its rows.
	Paused bool `json:"paused,omitempty"`
}

// MaxOpenStepsPage bounds one page of [OpenSteps].
const MaxOpenStepsPage = 5000

// OpenSteps returns at most limit (1 to [MaxOpenStepsPage]) unfinished
// step log rows after the cursor (afterTrip, afterStep; both "" for the
// first page), in (trip id, step) order. A page shorter than limit is the
// last.
func OpenSteps(ctx context.Context, db dbsqlc.DBTX, afterTrip, afterStep string, limit int) ([]OpenStep, error) {
	limit = min(max(limit, 1), MaxOpenStepsPage)
	rows, err := queries.StepListOpen(ctx, db, dbsqlc.StepListOpenParams{AfterTrip: afterTrip, AfterStep: afterStep, Max: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("saga: open steps: %w", err)
	}
	out := make([]OpenStep, 0, len(rows))
	for _, r := range rows {
		out = append(out, OpenStep{TripID: r.TripID, Step: r.Step, Status: r.Status, Attempts: int(r.Attempts),
			UndoAttempts: int(r.UndoAttempts), LastError: r.LastError, Since: r.StatusSince.UTC(), Paused: r.Paused})
	}
	return out, nil
}
