package events

import "slices"

// OperatorAction is the event type of an operator's action: a person asked,
// through the reconciler's API (POST /api/actions) or the tripsaga CLI, for
// something to be done about one trip (see [OperatorActionData]).
const OperatorAction = "io.tripsaga.operator.action.v1"

// StreamOperator holds the operators' actions (subjects "operator.>"): the
// audit trail of who asked for what, why and when.
const StreamOperator = "OPERATOR"

// Operator actions, the values of [OperatorActionData.Action].
const (
	// ActionRetryUndo: call the step's undo now instead of at its next
	// backoff (and lift a pause of the trip).
	ActionRetryUndo = "retry_undo"
	// ActionPause: stop calling the company for the trip's step (retries,
	// undos and late-commit checks) until resumed.
	ActionPause = "pause"
	// ActionResume lifts a pause; the step is due at once.
	ActionResume = "resume"
	// ActionResolve closes the trip's open incidents at the service (or
	// the one named by Incident) with the reason. Retries go on.
	ActionResolve = "resolve"
	// ActionRedrive hands a parked event (DeadLetter) to the consumer that
	// parked it, and to no other.
	ActionRedrive = "redrive"
	// ActionUndoLeak asks the owning service to undo, by its
	// Idempotency-Key, a company record the reconciler found in force for
	// a trip that should not have it (an orphan, or a late commit past the
	// re-check horizon).
	ActionUndoLeak = "undo_leak"
	// ActionSettle records that a person did a stuck step's work outside
	// the system (refunded the card by hand, released the room by phone,
	// sent the mail): the step is settled with Outcome, its retries stop,
	// its incidents are resolved and its event is published with
	// settled_by naming the operator, so the saga finishes from there.
	// Only a step that is stuck (an undo or a step that raised its
	// incident and is still unfinished) is settled, once.
	ActionSettle = "settle"
	// ActionDismiss closes one of the reconciler's open findings as seen
	// by a person, with why (Finding names it, Incident its kind): it no
	// longer counts as open while what it names still holds (the sweep
	// does not raise it again), and is resolved for good once it does
	// not. The reconciler carries it out itself, when it records it
	// (Service "reconciler").
	ActionDismiss = "dismiss"
)

// Outcomes of [ActionSettle] ([OperatorActionData.Outcome]).
const (
	// SettleUndone: the stuck undo was done by hand (the charge refunded,
	// the hold released); its undone event follows (payment.refunded).
	SettleUndone = "undone"
	// SettleDone: a forward step stuck unknown did happen (a person saw
	// the company's record, or sent the mail); its done event follows and
	// the saga goes on.
	SettleDone = "done"
	// SettleNotDone: a forward step stuck unknown did not happen (and a
	// person made sure it never will); its failed event follows and the
	// steps before it are undone. Refused for a forward-only step, which
	// is never given up (after the pivot only forward).
	SettleNotDone = "not_done"
)

// SettleOutcomes lists the outcomes of [ActionSettle].
var SettleOutcomes = []string{SettleUndone, SettleDone, SettleNotDone} //nolint:gochecknoglobals // read-only

// OperatorActions lists every action, in the order the docs give them.
var OperatorActions = []string{ActionRetryUndo, ActionPause, ActionResume, ActionResolve, ActionRedrive, ActionUndoLeak, ActionSettle, ActionDismiss} //nolint:gochecknoglobals // read-only

// OperatorActionData is the data of [OperatorAction]: who (Operator) asked
// for what (Action, about TripID, carried out by Service), why (Reason);
// when is the event's time.
type OperatorActionData struct {
	Action  string `json:"action"`
	TripID  string `json:"trip_id"`
	Service string `json:"service"`
	// Incident names the incident kind to resolve; empty resolves every
	// open incident of the trip at Service.
	Incident string `json:"incident,omitempty"`
	// Outcome is what a person did (ActionSettle only): one of
	// [SettleOutcomes].
	Outcome string `json:"outcome,omitempty"`
	// Step names the step to settle (ActionSettle only) when the service
	// owns several ("mail", "traveler_mail" of trips); empty: the
	// service's saga step (hotel, charge's "payment", car, insurance).
	Step     string `json:"step,omitempty"`
	Reason   string `json:"reason"`
	Operator string `json:"operator"`
	// IdempotencyKey is the Idempotency-Key the action was asked with: a
	// second request with it gets the same event back.
	IdempotencyKey string `json:"idempotency_key"`
	// DeadLetter is the parked event to re-drive (ActionRedrive only).
	DeadLetter *ParkedEvent `json:"dead_letter,omitempty"`
	// Finding names the finding dismissed (ActionDismiss only): its trip
	// id, or "?<company>/<record id>" for an unattributed record; TripID
	// is then "none". Its kind is in Incident.
	Finding string `json:"finding,omitempty"`
}

// ParkedEvent is a message an inbox parked on the DEADLETTER stream, as
// it was parked: the original headers and body, and where it came from.
type ParkedEvent struct {
	// Seq is its sequence in the DEADLETTER stream.
	Seq uint64 `json:"seq"`
	// Stream, StreamSeq and Subject say where it was consumed from.
	Stream    string `json:"stream"`
	StreamSeq uint64 `json:"stream_seq"`
	Subject   string `json:"subject"`
	// Consumer is the durable consumer (and inbox) that parked it.
	Consumer string `json:"consumer"`
	// Reason is why it was parked.
	Reason string `json:"reason"`
	// Headers are the original NATS headers (CloudEvents ce-* headers).
	Headers map[string][]string `json:"headers"`
	// Data is the original body (base64 in JSON).
	Data []byte `json:"data"`
}

// Operator declares the operators' actions in a [Catalogue]: the event
// type, the service that publishes it (the reconciler's API) and the
// services that carry actions out (each acts on those naming it).
type Operator struct {
	Type      string
	Publisher string
	Consumers []string
}

// Publishes returns every event type service publishes: its steps'
// outcomes, its compensations', its projections', the operators' actions
// when it is their publisher, and trip.requested for the trips API.
func (c Catalogue) Publishes(service string) []string {
	var out []string
	add := func(ts ...string) {
		for _, t := range ts {
			if !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	for _, s := range c.Steps {
		if s.Service == service {
			add(s.Publishes...)
			add(s.UndoEvents()...)
		}
	}
	for _, p := range c.Projections {
		if p.Service == service {
			add(p.Publishes...)
		}
	}
	if c.Operator.Type != "" && c.Operator.Publisher == service {
		add(c.Operator.Type)
	}
	if et, ok := c.Lookup(TripRequested); ok && et.Service == service {
		add(TripRequested)
	}
	if et, ok := c.Lookup(TripCancellationRequested); ok && et.Service == service {
		add(TripCancellationRequested) // by the API too (POST /trips/{id}/cancellation)
	}
	return out
}
