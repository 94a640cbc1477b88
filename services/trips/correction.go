package trips

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/saga"
)

// repairActions are the operators' actions that repair a half trip at a
// step service (the reconciler publishes an undo_leak only for a trip with
// an open half or orphan finding, and a settle only of a step that is
// stuck): either changes what the traveler of a confirmed trip was told.
var repairActions = []string{events.ActionUndoLeak, events.ActionSettle} //nolint:gochecknoglobals // read-only

// observeAction is the trips service's look at every operator action
// (saga.OperatorInboxConfig.Observe), in the action's inbox transaction:
// a repair (undo_leak, settle) naming a step service of a trip that is
// confirmed, whose confirmation mail was recorded, records the
// correction mail (step correction_mail, key "<trip>:mail:correction"):
// the traveler was told everything was booked, and the companies' records
// were found otherwise. One per trip: a second repair of the same trip
// finds the step's row there and sends nothing more. Actions naming the
// trips service itself (its mail steps) and trips in any other status
// (a canceled trip's mail said nothing is held, which the repair makes
// true; a canceling trip's final mail is still to come) send nothing.
func (s *Service) observeAction(ctx context.Context, tx pgx.Tx, _ event.Event, d events.OperatorActionData) error {
	if !slices.Contains(repairActions, d.Action) || d.Service == "" || d.Service == "trips" || !IsTripID(d.TripID) {
		return nil
	}
	row, err := queries.TripGetForUpdate(ctx, tx, d.TripID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // an orphan: no trip, no traveler to tell
	}
	if err != nil {
		return fmt.Errorf("trips: correction of %s: %w", d.TripID, err)
	}
	if row.Status != StatusConfirmed {
		return nil
	}
	keys, err := queries.TripMailKeys(ctx, tx, d.TripID)
	if err != nil {
		return fmt.Errorf("trips: correction of %s: %w", d.TripID, err)
	}
	if !slices.Contains(keys, d.TripID+":mail:"+StatusConfirmed) {
		return nil // not told it was confirmed (a trip projected before the mail step)
	}
	if slices.Contains(keys, d.TripID+":"+CorrectionKeyName) {
		return nil // corrected already: one correction per trip
	}
	var req events.TripRequest
	if err := json.Unmarshal(row.Request, &req); err != nil || req.Traveler.Email == "" {
		s.log.Error("trips: a confirmed trip without a traveler's email gets no correction", "trip_id", d.TripID, "err", err)
		return nil
	}
	subject, text := correctionMail(d, req)
	if _, err := s.correction.Request(ctx, tx, saga.Request{
		TripID: d.TripID, KeyName: CorrectionKeyName,
		Body: map[string]string{"to": oneLine(req.Traveler.Email), "subject": subject, "text": text, "trip_id": d.TripID},
	}); err != nil {
		return err
	}
	s.log.Warn("trips: correction mail recorded: a confirmed trip was repaired by an operator", "trip_id", d.TripID,
		"action", d.Action, "service", d.Service, "operator", d.Operator)
	return nil
}

// correctionMail is the correction's subject and text: what the traveler
// was told, that it was found otherwise, and what the operator did (the
// action, the service, the operator's reason).
func correctionMail(d events.OperatorActionData, req events.TripRequest) (subject, text string) {
	trip, name, reason := oneLine(d.TripID), oneLine(req.Traveler.Name), oneLine(d.Reason)
	what := "the " + oneLine(d.Service) + " record of your trip is being undone"
	if d.Action == events.ActionSettle {
		what = "the " + oneLine(d.Service) + " step of your trip was settled by hand"
	}
	subject = "Correction: your trip " + trip
	text = "Hello " + name + ",\n\nwe wrote that your trip " + trip + " is confirmed, with your room, payment and car all booked. " +
		"Since then we found that the companies' records of it do not match what we told you, and our operators are putting it right: " +
		what + " (" + reason + "). We are sorry for the confusion. Nothing is needed from you; " +
		"if this changes your plans, reply to this message.\n"
	return subject, text
}
