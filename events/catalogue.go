package events

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// StepClass says what may happen to a step once it is done, which orders
// the saga: compensable steps first, then the pivot, then forward-only ones.
type StepClass string

const (
	// Compensable steps can be undone by a compensation (release, refund).
	Compensable StepClass = "compensable"
	// Pivot is the last step that can fail. Once it is done the saga only
	// goes forward; it has no compensation.
	Pivot StepClass = "pivot"
	// ForwardOnly steps come after the pivot and are retried until they
	// succeed (an email cannot be unsent).
	ForwardOnly StepClass = "forward-only"
)

// EventType declares one event type: who publishes it and on which stream.
type EventType struct {
	Type      string // e.g. "io.tripsaga.hotel.held.v1"
	Service   string // the publishing service
	Stream    string // the JetStream stream holding it
	Data      string // name of the Go type of its data, for documentation
	Describes string
}

// Compensation is the undo of a compensable step.
type Compensation struct {
	Name      string   // e.g. "release"
	Trigger   []string // event types that ask for it
	Publishes []string // event types it publishes when done
	// Stuck is the event type it publishes when it raised its incident
	// (compensation_stuck past the attempt limit, or compensation_refused
	// at a refusal for good) while it goes on retrying: the step before
	// is undone on it as on the undo's own event, so one stuck undo does
	// not hold the others up, and the trip stays canceling with this undo
	// open until its Publishes come (the undo succeeded, or an operator
	// settled it by hand). Every saga text's rule: unwind newest first,
	// but a failed compensation does not stop the others.
	Stuck string
}

// Events returns every event type the compensation publishes: its
// Publishes, then Stuck.
func (c *Compensation) Events() []string {
	if c == nil {
		return nil
	}
	out := slices.Clone(c.Publishes)
	if c.Stuck != "" {
		out = append(out, c.Stuck)
	}
	return out
}

// Step is one step of the trip saga, owned by one service.
type Step struct {
	Name         string
	Service      string
	Class        StepClass
	Trigger      []string // event types that start it
	Publishes    []string // event types it publishes
	Compensation *Compensation
	// Stuck, on the pivot (a step with no compensation), is the event
	// type it publishes when its undo by key at the deadline (its outcome
	// still unknown: canceled by key, then published as its failed event)
	// raised its incident while it goes on retrying: the step before is
	// undone on it, as on a compensation's Stuck, and the trip stays
	// canceling with this step open until its failed event comes (the
	// cancel succeeded, or an operator settled it undone). A compensable
	// step's is its Compensation.Stuck (see [Step.StuckType]).
	Stuck string
}

// StuckType returns the event type step s publishes when its undo raised
// its incident: its compensation's Stuck, else its own; "" for none.
func (s Step) StuckType() string {
	if s.Compensation != nil {
		return s.Compensation.Stuck
	}
	return s.Stuck
}

// UndoEvents returns the event types step s publishes besides its
// Publishes: its compensation's ([Compensation.Events]) and its own Stuck.
func (s Step) UndoEvents() []string {
	out := s.Compensation.Events()
	if s.Stuck != "" {
		out = append(out, s.Stuck)
	}
	return out
}

// Projection is a consumer that follows events to build a read model and
// has no step of its own (the trips status, the reconciler's view).
type Projection struct {
	Name      string
	Service   string
	Consumes  []string
	Publishes []string // e.g. the trips projection publishes trip.canceled once all is undone
}

// Catalogue declares every event type, step and projection of the system.
type Catalogue struct {
	Types       []EventType
	Steps       []Step // in saga order
	Projections []Projection
	// Operator declares the operators' actions (see [Operator]).
	Operator Operator
	// Start is the event type that starts a saga of the catalogue (the
	// trip's trip.requested): its publisher took the saga, and a step
	// service checks a trigger from another step service against it
	// (saga.OriginFunc). Empty: no such check is possible.
	Start string
}

// Default is the trip saga: hotel (compensable) -> payment (compensable) ->
// car (pivot) -> confirm -> mail (forward-only).
var Default = Catalogue{ //nolint:gochecknoglobals // read-only declaration
	Start: TripRequested,
	Types: []EventType{
		{TripRequested, "trips", StreamTrips, "TripRequestedData", "a traveler asked for a trip"},
		{TripConfirmed, "trips", StreamTrips, "TripSettledData", "every step is done"},
		{TripCanceled, "trips", StreamTrips, "TripSettledData", "every step that happened is undone"},
		{MailSent, "trips", StreamTrips, "StepData", "the traveler was emailed the outcome"},
		{HotelHeld, "hotel", StreamHotel, "StepData", "the room is held"},
		{HotelRejected, "hotel", StreamHotel, "StepData", "the hotel is sold out"},
		{HotelFailed, "hotel", StreamHotel, "StepData", "the hold could not be confirmed by its deadline and was undone"},
		{HotelReleased, "hotel", StreamHotel, "StepData", "the hold was released (compensation)"},
		{HotelReleaseStuck, "hotel", StreamHotel, "StepData", "the release raised its incident (stuck or refused) and goes on retrying; the trip stays canceling with it open"},
		{PaymentCharged, "payment", StreamPayment, "StepData", "the card is charged"},
		{PaymentDeclined, "payment", StreamPayment, "StepData", "the card was declined"},
		{PaymentFailed, "payment", StreamPayment, "StepData", "the charge could not be confirmed by its deadline and was undone"},
		{PaymentRefunded, "payment", StreamPayment, "StepData", "the charge was refunded (compensation; settled_by names the operator who recorded a refund made by hand)"},
		{PaymentRefundStuck, "payment", StreamPayment, "StepData", "the refund raised its incident (stuck or refused) and goes on retrying; the steps before it are undone meanwhile"},
		{CarBooked, "car", StreamCar, "StepData", "the car is booked (pivot done)"},
		{CarRejected, "car", StreamCar, "StepData", "the car firm is sold out"},
		{CarFailed, "car", StreamCar, "StepData", "the booking could not be confirmed by its deadline and was canceled by key"},
		{CarCancelStuck, "car", StreamCar, "StepData", "the cancel by key of a booking unknown at its deadline raised its incident (stuck or refused) and goes on retrying; the steps before it are undone meanwhile"},
		{TripCancellationRequested, "trips", StreamTrips, "CancellationData", "the traveler canceled a confirmed trip; the fee is kept, the rest refunded"},
		{TripCanceledByTraveler, "trips", StreamTrips, "TripSettledData", "the traveler's cancellation is done: hold released, car canceled, charge refunded but the fee"},
		{HotelTravelerReleased, "hotel", StreamHotel, "StepData", "the hold was released for the traveler's cancellation"},
		{PaymentTravelerRefunded, "payment", StreamPayment, "StepData", "the charge was refunded but the fee for the traveler's cancellation"},
		{CarTravelerCanceled, "car", StreamCar, "StepData", "the car booking was canceled for the traveler's cancellation"},
		{OperatorAction, "reconciler", StreamOperator, "OperatorActionData", "an operator asked for an action on a trip (retry an undo now, pause or resume its retries, resolve an incident, re-drive a dead letter, undo a leaked company record)"},
	},
	Steps: []Step{
		{
			Name: "hotel", Service: "hotel", Class: Compensable,
			Trigger:   []string{TripRequested},
			Publishes: []string{HotelHeld, HotelRejected, HotelFailed},
			Compensation: &Compensation{
				Name:      "release",
				Trigger:   []string{PaymentDeclined, PaymentFailed, PaymentRefunded, PaymentRefundStuck},
				Publishes: []string{HotelReleased},
				Stuck:     HotelReleaseStuck,
			},
		},
		{
			Name: "payment", Service: "payment", Class: Compensable,
			Trigger:   []string{HotelHeld},
			Publishes: []string{PaymentCharged, PaymentDeclined, PaymentFailed},
			Compensation: &Compensation{
				Name:      "refund",
				Trigger:   []string{CarRejected, CarFailed, CarCancelStuck},
				Publishes: []string{PaymentRefunded},
				Stuck:     PaymentRefundStuck,
			},
		},
		{
			Name: "car", Service: "car", Class: Pivot,
			Trigger:   []string{PaymentCharged},
			Publishes: []string{CarBooked, CarRejected, CarFailed},
			Stuck:     CarCancelStuck,
		},
		{
			Name: "confirm", Service: "trips", Class: ForwardOnly,
			Trigger:   []string{CarBooked},
			Publishes: []string{TripConfirmed},
		},
		{
			Name: "mail", Service: "trips", Class: ForwardOnly,
			Trigger:   []string{TripConfirmed, TripCanceled},
			Publishes: []string{MailSent},
		},
		// The traveler's cancellation of a confirmed trip (cancellation.go):
		// after the pivot, so forward-only, each retried until done.
		{
			Name: "traveler_release", Service: "hotel", Class: ForwardOnly,
			Trigger:   []string{TripCancellationRequested},
			Publishes: []string{HotelTravelerReleased},
		},
		{
			Name: "traveler_refund", Service: "payment", Class: ForwardOnly,
			Trigger:   []string{TripCancellationRequested},
			Publishes: []string{PaymentTravelerRefunded},
		},
		{
			Name: "traveler_cancel", Service: "car", Class: ForwardOnly,
			Trigger:   []string{TripCancellationRequested},
			Publishes: []string{CarTravelerCanceled},
		},
		{
			Name: "traveler_settle", Service: "trips", Class: ForwardOnly,
			Trigger:   []string{HotelTravelerReleased, PaymentTravelerRefunded, CarTravelerCanceled},
			Publishes: []string{TripCanceledByTraveler},
		},
		{
			Name: "traveler_mail", Service: "trips", Class: ForwardOnly,
			Trigger:   []string{TripCanceledByTraveler},
			Publishes: []string{MailSent},
		},
	},
	Projections: []Projection{
		{
			Name: "trips", Service: "trips",
			Publishes: []string{TripCanceled},
			Consumes: []string{
				HotelHeld, HotelRejected, HotelFailed, HotelReleased, HotelReleaseStuck,
				PaymentCharged, PaymentDeclined, PaymentFailed, PaymentRefunded, PaymentRefundStuck,
				CarBooked, CarRejected, CarFailed, CarCancelStuck,
				HotelTravelerReleased, PaymentTravelerRefunded, CarTravelerCanceled,
			},
		},
		{
			Name: "reconciler", Service: "reconciler",
			Consumes: []string{
				TripRequested, TripConfirmed, TripCanceled, MailSent,
				HotelHeld, HotelRejected, HotelFailed, HotelReleased, HotelReleaseStuck,
				PaymentCharged, PaymentDeclined, PaymentFailed, PaymentRefunded, PaymentRefundStuck,
				CarBooked, CarRejected, CarFailed, CarCancelStuck,
				TripCancellationRequested, TripCanceledByTraveler,
				HotelTravelerReleased, PaymentTravelerRefunded, CarTravelerCanceled,
			},
		},
	},
	Operator: Operator{Type: OperatorAction, Publisher: "reconciler", Consumers: []string{"trips", "hotel", "payment", "car", "reconciler"}},
}

// Lookup returns the declaration of typ.
func (c Catalogue) Lookup(typ string) (EventType, bool) {
	for _, t := range c.Types {
		if t.Type == typ {
			return t, true
		}
	}
	return EventType{}, false
}

// Step returns the step named name.
func (c Catalogue) Step(name string) (Step, bool) {
	for _, s := range c.Steps {
		if s.Name == name {
			return s, true
		}
	}
	return Step{}, false
}

// Consumes returns every event type that service consumes, through its
// steps' triggers, its compensations' triggers and its projections.
func (c Catalogue) Consumes(service string) []string {
	var out []string
	add := func(ts []string) {
		for _, t := range ts {
			if !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	for _, s := range c.Steps {
		if s.Service == service {
			add(s.Trigger)
			if s.Compensation != nil {
				add(s.Compensation.Trigger)
			}
		}
	}
	for _, p := range c.Projections {
		if p.Service == service {
			add(p.Consumes)
		}
	}
	if c.Operator.Type != "" && slices.Contains(c.Operator.Consumers, service) {
		add([]string{c.Operator.Type})
	}
	return out
}

// Streams lists the streams that carry the given event types, each with
// the NATS subject filters ("<kind>.>") that select them.
func (c Catalogue) Streams(types []string) map[string][]string {
	out := map[string][]string{}
	for _, typ := range types {
		et, ok := c.Lookup(typ)
		if !ok {
			continue
		}
		f := Kind(typ) + ".>"
		if !slices.Contains(out[et.Stream], f) {
			out[et.Stream] = append(out[et.Stream], f)
		}
	}
	for _, fs := range out {
		slices.Sort(fs)
	}
	return out
}

// StreamSubjects returns, for every stream, the subjects it holds
// ("hotel.>"), derived from the declared types' kinds.
func (c Catalogue) StreamSubjects() map[string][]string {
	out := map[string][]string{}
	for _, t := range c.Types {
		f := strings.SplitN(Kind(t.Type), ".", 2)[0] + ".>"
		if !slices.Contains(out[t.Stream], f) {
			out[t.Stream] = append(out[t.Stream], f)
		}
	}
	return out
}

// StreamOf returns the stream of c whose subjects ("<kind prefix>.>", see
// [Catalogue.StreamSubjects]) cover the NATS subject, and false when none
// does: an event on that subject would be refused by JetStream (no
// responders) and could never be published.
func (c Catalogue) StreamOf(subject string) (string, bool) {
	first, _, _ := strings.Cut(subject, ".")
	for stream, filters := range c.StreamSubjects() {
		if slices.Contains(filters, first+".>") {
			return stream, true
		}
	}
	return "", false
}

// Validate checks the saga's shape. It returns an error wrapping
// [ErrInvalidCatalogue] for each of: a malformed or duplicate type, a step
// that publishes or consumes an undeclared type, a compensable step without
// a compensation, a pivot or forward-only step with one, not exactly one
// pivot, a step after the pivot that is not forward-only, a compensable step
// after the pivot, and a published event type that nobody consumes.
func (c Catalogue) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidCatalogue}, args...)...))
	}
	seen := map[string]bool{}
	for _, t := range c.Types {
		if Kind(t.Type) == "" {
			bad("type %q is not <reverse-DNS prefix>.<entity>.<happening>.v<N> (io.tripsaga.hotel.held.v1)", t.Type)
		}
		if seen[t.Type] {
			bad("type %q declared twice", t.Type)
		}
		seen[t.Type] = true
	}
	consumed := map[string]bool{}
	published := map[string]bool{}
	check := func(where string, ts []string) {
		for _, t := range ts {
			if !seen[t] {
				bad("%s names undeclared type %q", where, t)
			}
		}
	}
	pivot := -1
	for i, s := range c.Steps {
		check("step "+s.Name+" trigger", s.Trigger)
		check("step "+s.Name+" publishes", s.Publishes)
		for _, t := range s.Trigger {
			consumed[t] = true
		}
		for _, t := range s.Publishes {
			published[t] = true
		}
		if len(s.Trigger) == 0 {
			bad("step %s has no trigger", s.Name)
		}
		switch s.Class {
		case Compensable:
			if s.Compensation == nil {
				bad("compensable step %s has no compensation", s.Name)
			}
			if pivot >= 0 {
				bad("compensable step %s comes after the pivot", s.Name)
			}
		case Pivot:
			if pivot >= 0 {
				bad("step %s is a second pivot", s.Name)
			}
			pivot = i
			if s.Compensation != nil {
				bad("pivot %s has a compensation: after the pivot only forward", s.Name)
			}
		case ForwardOnly:
			if pivot < 0 {
				bad("forward-only step %s comes before the pivot", s.Name)
			}
			if s.Compensation != nil {
				bad("forward-only step %s has a compensation", s.Name)
			}
		default:
			bad("step %s has unknown class %q", s.Name, s.Class)
		}
		if pivot >= 0 && i > pivot && s.Class != ForwardOnly {
			bad("step %s after the pivot is %s, not forward-only", s.Name, s.Class)
		}
		if s.Stuck != "" {
			if s.Class != Pivot {
				bad("step %s is %s and declares its own stuck event: only the pivot does (a compensable step's is its compensation's)", s.Name, s.Class)
			}
			check("step "+s.Name+" stuck", []string{s.Stuck})
			published[s.Stuck] = true
		}
		if s.Compensation != nil {
			check("compensation "+s.Compensation.Name+" trigger", s.Compensation.Trigger)
			check("compensation "+s.Compensation.Name+" publishes", s.Compensation.Events())
			for _, t := range s.Compensation.Trigger {
				consumed[t] = true
			}
			for _, t := range s.Compensation.Events() {
				published[t] = true
			}
		}
	}
	if pivot < 0 {
		bad("no pivot step")
	}
	for _, p := range c.Projections {
		check("projection "+p.Name, p.Consumes)
		check("projection "+p.Name+" publishes", p.Publishes)
		for _, t := range p.Consumes {
			consumed[t] = true
		}
		for _, t := range p.Publishes {
			published[t] = true
		}
	}
	if c.Operator.Type != "" {
		check("operator actions", []string{c.Operator.Type})
		if c.Operator.Publisher != "" {
			published[c.Operator.Type] = true
		}
		if len(c.Operator.Consumers) > 0 {
			consumed[c.Operator.Type] = true
		}
	}
	for _, t := range c.Types {
		if (c.Start != "" && t.Type == c.Start) || t.Type == TripRequested || t.Type == TripCancellationRequested {
			published[t.Type] = true // published by the saga's entry (the trips API), not a step
		}
	}
	for _, t := range c.Types {
		if !published[t.Type] {
			bad("type %q is declared but no step publishes it", t.Type)
		}
		if !consumed[t.Type] {
			bad("type %q is published but has no consumer", t.Type)
		}
	}
	return errors.Join(errs...)
}
