package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/saga"
)

// ActionOutcome is what the service that carries out a recorded action
// reports it did (GET /api/actions/{event_id}/outcome): its operator
// log's entry for the action's event (saga.OperatorEntry.Effect), once
// it has one.
type ActionOutcome struct {
	EventID string `json:"event_id"`
	Action  string `json:"action"`
	TripID  string `json:"trip_id"`
	Service string `json:"service"`
	// Reported is true once the service has carried the action out and
	// said what it did in Effect ("2 open incident(s) resolved",
	// "refused: step hotel is forward-only, never undone", ...).
	Reported bool      `json:"reported"`
	Effect   string    `json:"effect,omitempty"`
	At       time.Time `json:"at,omitzero"`
	// Done is false when the service refused the action or it changed
	// nothing ([EffectDidNothing]).
	Done bool `json:"done"`
	// Unread says why the service could not be asked (its URL unknown,
	// it did not answer); the action stays recorded and is carried out
	// when the service consumes it.
	Unread string `json:"unread,omitempty"`
}

// EffectDidNothing reports whether a service's effect says the action
// changed nothing: refused ("refused: ...") or a resolve that found no
// open incident ("0 open incident(s) resolved"), or a retry or resume
// that made no step due and lifted no pause ("0 unfinished step(s) due
// now" and nothing after it).
func EffectDidNothing(effect string) bool {
	return strings.HasPrefix(effect, "refused") || strings.HasPrefix(effect, "0 open incident(s) resolved") ||
		effect == "0 unfinished step(s) due now"
}

// Outcome returns what the service reported of the action recorded with
// event id; an [ActionError] 404 when no action has that id.
func (o *Operator) Outcome(ctx context.Context, id string) (ActionOutcome, error) {
	row, err := queries.OperatorActionGet(ctx, o.r.cfg.Pool, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return ActionOutcome{}, &ActionError{Status: http.StatusNotFound, Detail: fmt.Sprintf("no action was recorded with event id %q", id)}
	}
	if err != nil {
		return ActionOutcome{}, fmt.Errorf("action %s: %w", id, err)
	}
	out := ActionOutcome{EventID: row.EventID, Action: row.Action, TripID: row.TripID, Service: row.Service}
	if row.Action == events.ActionDismiss { // carried out in the transaction that recorded it
		out.Reported, out.Done, out.At, out.Effect = true, true, row.CreatedAt.UTC(), "finding dismissed: it no longer counts as open while it holds"
		return out, nil
	}
	base, ok := o.r.cfg.Services[row.Service]
	if !ok {
		// Nothing to read it from (the reconciler's own re-drives among
		// them: it keeps no operator log), whatever it did.
		out.Unread = fmt.Sprintf("the URL of %s is not known (%s)", row.Service, ServiceURLsEnv)
		return out, nil
	}
	var log operatorLog
	var nf *notFoundError
	if err := getJSON(ctx, base+"/operator/"+url.PathEscape(row.TripID), &log); err != nil && !errors.As(err, &nf) {
		out.Unread = fmt.Sprintf("%s operator log: %v", row.Service, err)
	}
	if i := slices.IndexFunc(log.Items, func(e saga.OperatorEntry) bool { return e.EventID == id }); i >= 0 {
		e := log.Items[i]
		out.Reported, out.Effect, out.At, out.Done = true, e.Effect, e.At, !EffectDidNothing(e.Effect)
		return out, nil
	}
	// A service that cannot carry the action out parks it (a re-drive of
	// an event it still cannot decode, say): that is its outcome too.
	dls, err := o.DeadLetters(ctx)
	if err != nil {
		return out, nil //nolint:nilerr // the dead letters not readable now: not reported yet, asked again
	}
	for _, d := range dls {
		if d.Stream == events.StreamOperator && d.EventID == id && d.Consumer == row.Service {
			out.Reported, out.At, out.Done, out.Unread = true, d.Time, false, ""
			out.Effect = fmt.Sprintf("parked by %s on %s: %s", d.Consumer, events.StreamDeadLetter, d.Reason)
		}
	}
	return out, nil
}

func (o *Operator) serveOutcome(w http.ResponseWriter, req *http.Request) {
	out, err := o.Outcome(req.Context(), req.PathValue("event_id"))
	var ae *ActionError
	if errors.As(err, &ae) {
		process.WriteProblem(w, process.Problem{Type: ae.problemType(), Title: "No such action", Status: ae.Status, Detail: ae.Detail, Instance: req.URL.EscapedPath()})
		return
	}
	if err != nil {
		process.WriteError(w, req, o.log, "reconciler: action outcome", err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// knownTarget refuses, before it is recorded, an action about a trip that
// nobody knows of or an incident that is not open: the trip must be in
// the view, have a finding, or have a step at the service (when the
// service can be asked); resolve needs an open incident of the trip at
// the service (of the kind named, when one is), when the service can be
// asked. A service that cannot be asked refuses nothing here: the
// outcome it reports later says what it did. A key already recorded is
// not judged again: its request gets its recorded event back, as before
// the incident it resolved was closed.
func (o *Operator) knownTarget(ctx context.Context, key string, ar ActionRequest) error {
	if _, err := queries.OperatorActionGetByKey(ctx, o.r.cfg.Pool, key); err == nil {
		return nil
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("action %s: %w", key, err)
	}
	base, readable := o.r.cfg.Services[ar.Service]
	var steps struct {
		Items []saga.StepView `json:"items"`
	}
	stepsRead := readable && getJSON(ctx, base+"/steps/"+url.PathEscape(ar.Trip), &steps) == nil
	if !stepsRead || len(steps.Items) == 0 {
		_, err := queries.TripViewGet(ctx, o.r.cfg.Pool, ar.Trip)
		inView := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("trip %s: %w", ar.Trip, err)
		}
		fs, err := queries.FindingListByTrip(ctx, o.r.cfg.Pool, ar.Trip)
		if err != nil {
			return fmt.Errorf("findings of %s: %w", ar.Trip, err)
		}
		if !inView && len(fs) == 0 && stepsRead {
			return &ActionError{Status: http.StatusNotFound, Title: "No such trip", Detail: fmt.Sprintf(
				"trip %s is not known: no event of it in the reconciler's view, no finding, and %s has no step of it; nothing to %s", ar.Trip, ar.Service, ar.Action)}
		}
	}
	if ar.Action == events.ActionRetryUndo && stepsRead {
		return retryable(ar, steps.Items)
	}
	if ar.Action != events.ActionResolve || !readable {
		return nil
	}
	incs, err := o.r.serviceIncidents(ctx, ar.Service, base)
	if err != nil {
		return nil //nolint:nilerr // not readable now: the outcome the service reports says what it did
	}
	var open []string
	for _, in := range incs {
		if in.TripID == ar.Trip && in.ResolvedAt == nil {
			if ar.Incident == "" || in.Kind == ar.Incident {
				return nil
			}
			open = append(open, in.Kind)
		}
	}
	what := "no open incident"
	if ar.Incident != "" {
		what = "no open incident " + ar.Incident
	}
	detail := fmt.Sprintf("trip %s has %s at %s", ar.Trip, what, ar.Service)
	if len(open) > 0 {
		detail += " (open there: " + strings.Join(open, ", ") + ")"
	} else {
		detail += "; its incidents are listed by `tripsaga incidents list`"
	}
	return &ActionError{Status: http.StatusConflict, Detail: detail}
}

// retryable refuses a retry_undo at a service that has no unfinished
// step of the trip (pending, started, unknown or compensating: the rows
// the retry makes due now), naming the steps it has: the retry would
// change nothing there (an incident at another service, say).
func retryable(ar ActionRequest, steps []saga.StepView) error {
	var have []string
	for _, st := range steps {
		switch st.Status {
		case "pending", "started", "unknown", "compensating":
			return nil
		}
		have = append(have, st.Step+" "+st.Status)
	}
	detail := fmt.Sprintf("%s has no step of trip %s: nothing to retry there", ar.Service, ar.Trip)
	if len(have) > 0 {
		detail = fmt.Sprintf("%s has no unfinished step of trip %s (its steps: %s): nothing to retry there", ar.Service, ar.Trip, strings.Join(have, ", "))
	}
	return &ActionError{Status: http.StatusConflict, Detail: detail + "; `tripsaga incidents list` names the service of each open incident"}
}

// dismissable refuses, before it is recorded, a dismiss that names no
// open finding: ar.Trip the finding's trip id (or "?<company>/<record
// id>"), ar.Incident its kind. A key already recorded is not judged again.
func (o *Operator) dismissable(ctx context.Context, key string, ar ActionRequest) error {
	switch {
	case ar.Trip == "":
		return bad("trip", "required: the finding's trip id, or ?<company>/<record id> for an unattributed record")
	case !slices.Contains(FindingKinds, ar.Incident):
		return bad("incident", "required for dismiss: the finding's kind, one of "+strings.Join(FindingKinds, ", "))
	case ar.Service != "" && ar.Service != ProjectionName:
		return bad("service", "a finding is the reconciler's: leave it out, or give "+ProjectionName)
	}
	if _, err := queries.OperatorActionGetByKey(ctx, o.r.cfg.Pool, key); err == nil {
		return nil
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("action %s: %w", key, err)
	}
	rows, err := queries.FindingListByTrip(ctx, o.r.cfg.Pool, ar.Trip)
	if err != nil {
		return fmt.Errorf("findings of %s: %w", ar.Trip, err)
	}
	var open []string
	for _, r := range rows {
		if r.ResolvedAt != nil {
			continue
		}
		if r.Kind == ar.Incident {
			if r.DismissedAt != nil {
				return &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf("the %s finding of %s was dismissed already, by %s at %s: %s",
					r.Kind, ar.Trip, deref(r.DismissedBy), r.DismissedAt.UTC().Format(time.RFC3339), deref(r.DismissReason))}
			}
			return nil
		}
		open = append(open, r.Kind)
	}
	detail := fmt.Sprintf("%s has no open %s finding", ar.Trip, ar.Incident)
	if len(open) > 0 {
		detail += " (open: " + strings.Join(open, ", ") + ")"
	}
	return &ActionError{Status: http.StatusConflict, Detail: detail}
}
