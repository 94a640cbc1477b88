package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/reconciler/internal/dbsqlc"
)

// settleable checks a settle (events.ActionSettle) before it is recorded,
// and returns the name of the step it settles:
// an outcome of events.SettleOutcomes; a step, when named, that the
// service owns; never a second settle of one step (a request with the key
// of the first replays it instead: record answers it); and, for the
// outcome undone of the service's saga step, that its undo is stuck by the
// events: its stuck event (payment.refund_stuck; the pivot's
// car.cancel_stuck, its cancel by key at the deadline) seen, and neither its
// undone nor its failed event (409 otherwise, naming what was seen). The
// service checks its step log too (a step not stuck is refused there,
// and the refusal is its operator log's effect): done and not_done are
// checked there only, since a forward step's incident shows in no event.
func (o *Operator) settleable(ctx context.Context, key string, ar ActionRequest) (string, error) {
	if !slices.Contains(events.SettleOutcomes, ar.Outcome) {
		return "", bad("outcome", "required for settle: one of "+strings.Join(events.SettleOutcomes, ", ")+" (what a person did outside the system)")
	}
	// The trip's own order decides which step the service owns and
	// whether it has an undo (the car is compensable in a charge-last
	// trip, the pivot in a default one); STEPS for a trip not seen yet.
	cat := o.r.cfg.Catalogue
	if v, err := queries.TripViewGet(ctx, o.r.cfg.Pool, ar.Trip); err == nil {
		if c, err := events.CatalogueOf(v.Version); err == nil {
			cat = c
		}
	}
	var saga *events.Step
	for _, st := range cat.Steps {
		if st.Service != ar.Service {
			continue
		}
		if ar.Step == "" && st.Class != events.ForwardOnly {
			saga = &st
			break
		}
		if st.Name == ar.Step {
			saga = &st
			break
		}
	}
	if saga == nil {
		if ar.Step != "" {
			return "", bad("step", fmt.Sprintf("%s owns no step %q", ar.Service, ar.Step))
		}
		return "", bad("step", fmt.Sprintf("required: %s owns no saga step, name the one to settle", ar.Service))
	}
	if _, err := queries.OperatorActionGetByKey(ctx, o.r.cfg.Pool, key); err == nil {
		return saga.Name, nil // the same key again: record replays it, or refuses another request
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("action by key: %w", err)
	}
	prev, err := queries.OperatorActionList(ctx, o.r.cfg.Pool, dbsqlc.OperatorActionListParams{TripID: ar.Trip, Max: 1000})
	if err != nil {
		return "", fmt.Errorf("actions of %s: %w", ar.Trip, err)
	}
	for _, p := range prev {
		if p.Action != events.ActionSettle || p.Service != ar.Service {
			continue
		}
		var e event.Event
		var pd events.OperatorActionData
		if json.Unmarshal(p.Event, &e) != nil || events.DecodeData(e, &pd) != nil || pd.Step != saga.Name {
			continue
		}
		return "", &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf(
			"step %s of trip %s was settled already (%s, by %s at %s: %s): a step is settled once",
			saga.Name, ar.Trip, pd.Outcome, p.Operator, p.CreatedAt.UTC().Format(time.RFC3339), p.Reason)}
	}
	if ar.Outcome != events.SettleUndone {
		return saga.Name, nil
	}
	stuck := saga.StuckType() // a compensation's, or the pivot's undo by key at its deadline
	if stuck == "" {
		return "", &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf(
			"step %s is %s and has no undo: settle it %s or %s", saga.Name, saga.Class, events.SettleDone, events.SettleNotDone)}
	}
	v, err := queries.TripViewGet(ctx, o.r.cfg.Pool, ar.Trip)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf("trip %s: no event of it seen, so no undo of it is stuck", ar.Trip)}
	}
	if err != nil {
		return "", fmt.Errorf("trip_view %s: %w", ar.Trip, err)
	}
	has := func(typ string) bool { return typ != "" && slices.Contains(v.Seen, events.Kind(typ)) }
	var undone []string
	if saga.Compensation != nil {
		undone = slices.Clone(saga.Compensation.Publishes)
	}
	for _, typ := range append(undone, saga.Publishes[len(saga.Publishes)-1]) {
		if has(typ) {
			return "", &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf(
				"the undo of step %s of trip %s is done already (%s seen): nothing to settle", saga.Name, ar.Trip, events.Kind(typ))}
		}
	}
	if !has(stuck) {
		return "", &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf(
			"the undo of step %s of trip %s is not stuck (no %s seen; seen: %s): settle only an undo that raised its incident, retry_undo calls it now",
			saga.Name, ar.Trip, events.Kind(stuck), strings.Join(v.Seen, ", "))}
	}
	return saga.Name, nil
}
