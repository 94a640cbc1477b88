package events

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
)

// The optional travel-insurance step's event types (stream INSURANCE),
// declared in the catalogue only when the step is on (see [Catalogue.WithSteps]).
const (
	InsuranceBought   = "io.tripsaga.insurance.bought.v1"
	InsuranceRejected = "io.tripsaga.insurance.rejected.v1" // the insurer refused the risk: final, no policy
	InsuranceFailed   = "io.tripsaga.insurance.failed.v1"   // unknown past the deadline, canceled by key
	InsuranceCanceled = "io.tripsaga.insurance.canceled.v1" // compensation done
	// InsuranceCancelStuck: the policy's cancel raised its incident and
	// goes on retrying (see [Compensation.Stuck]).
	InsuranceCancelStuck = "io.tripsaga.insurance.cancel_stuck.v1"
	// InsuranceTravelerCanceled: the policy was canceled, the insurer's
	// part in the traveler's cancellation of a confirmed trip.
	InsuranceTravelerCanceled = "io.tripsaga.insurance.traveler_canceled.v1"

	StreamInsurance = "INSURANCE"
)

// StepsVar is the environment variable that orders the saga's steps
// (compensable steps and the pivot), e.g. "hotel,insurance,payment,car";
// unset or empty: [Default]'s order.
const StepsVar = "STEPS"

// OptionalStep is a step a configuration may add to [Default]: the step
// as declared (its Trigger and its compensation's Trigger are rewired by
// [Catalogue.WithSteps] to its place in the order), its event types, and
// the forward-only steps it adds after the pivot (its part in the
// traveler's cancellation), which join their siblings: the steps with the
// same trigger.
type OptionalStep struct {
	Step  Step
	Types []EventType
	After []Step
}

// Optional lists the steps [Catalogue.WithSteps] may add. Travel insurance
// is compensable (a policy is canceled by key) and belongs before the pivot.
var Optional = []OptionalStep{ //nolint:gochecknoglobals // read-only declaration
	{
		// Its Trigger and its compensation's come from its place in
		// STEPS ([Catalogue.WithSteps]): they are not its own.
		Step: Step{
			Name: "insurance", Service: "insurance", Class: Compensable,
			Publishes:    []string{InsuranceBought, InsuranceRejected, InsuranceFailed},
			Compensation: &Compensation{Name: "cancel", Publishes: []string{InsuranceCanceled}, Stuck: InsuranceCancelStuck},
		},
		Types: stepTypes("insurance", StreamInsurance,
			InsuranceBought, "the travel insurance policy is bought",
			InsuranceRejected, "the insurer refused to insure the trip",
			InsuranceFailed, "the policy could not be confirmed by its deadline and was canceled by key",
			InsuranceCanceled, "the policy was canceled (compensation)",
			InsuranceCancelStuck, "the policy's cancel raised its incident (stuck or refused) and goes on retrying; the steps before it are undone meanwhile",
			InsuranceTravelerCanceled, "the policy was canceled for the traveler's cancellation",
		),
		After: []Step{{
			Name: "traveler_void", Service: "insurance", Class: ForwardOnly,
			Trigger:   []string{TripCancellationRequested},
			Publishes: []string{InsuranceTravelerCanceled},
		}},
	},
}

// Form is what a saga step of [Default] is in an order that gives it the
// other role than Default's: its compensation when it comes before the
// pivot, its stuck event when it is the pivot, and the event types that
// role adds (declared only in an order that uses it).
type Form struct {
	// Compensation is the step's undo when it comes before the pivot
	// (its Trigger is rewired by [Catalogue.WithSteps]); nil: the step
	// has none there and must be the pivot.
	Compensation *Compensation
	// Stuck is the step's stuck event when it is the pivot ([Step.Stuck]:
	// its undo by key at the deadline raised its incident); "": the step
	// cannot be the pivot.
	Stuck string
	// Types are the event types the role adds ([CarCanceled]).
	Types []EventType
}

// Forms declares the roles the steps of [Default] may take besides the
// one Default gives them: the car may come before the pivot (canceled by
// key, car.canceled; its stuck event car.cancel_stuck, as when its cancel
// by key at the deadline is stuck), and the payment may be the pivot (its
// undo by key at the deadline is the refund by key, stuck as
// payment.refund_stuck). A step with a Stuck here or in its declaration
// can be the pivot; the pivot of an order is the last such step it names
// (see [Catalogue.WithSteps]).
var Forms = map[string]Form{ //nolint:gochecknoglobals // read-only declaration
	"car": {
		Compensation: &Compensation{Name: "cancel", Publishes: []string{CarCanceled}, Stuck: CarCancelStuck},
		Types: stepTypes("car", StreamCar,
			CarCanceled, "the booking was canceled by key (compensation, in an order where the car comes before the pivot: charge-last)"),
	},
	"payment": {Stuck: PaymentRefundStuck},
}

// ChargeLast is the charge-last order: the money is the pivot, charged
// only once the hotel is held and the car booked, so a sold-out car never
// touches the card (docs/how-it-works.md, "Choosing the order").
const ChargeLast = "hotel,car,payment"

// Orders are the declared orders of [Default]'s own steps: Default's
// (the charge before the car, the car the pivot) and [ChargeLast]. Each
// is a trip version with any [Optional] step put anywhere before its
// pivot ([Versions]): every service is ready for trips of all of them
// whatever its own STEPS, so the trips service may switch between them
// and the trips started under one finish under it.
var Orders = [][]string{{"hotel", "payment", "car"}, {"hotel", "car", "payment"}} //nolint:gochecknoglobals // read-only declaration

// canPivot reports whether step s can be the pivot of an order.
func canPivot(s Step) bool { return s.Class == Pivot || Forms[s.Name].Stuck != "" }

// asPivot returns s as the pivot: no compensation, its stuck event its
// own ([Step.Stuck]).
func asPivot(s Step) Step {
	if s.Class == Pivot {
		return s
	}
	s.Class, s.Compensation, s.Stuck = Pivot, nil, Forms[s.Name].Stuck
	return s
}

// asCompensable returns s before the pivot with its compensation, and
// false when it has none.
func asCompensable(s Step) (Step, bool) {
	if s.Class == Compensable {
		return s, true
	}
	f := Forms[s.Name]
	if f.Compensation == nil {
		return s, false
	}
	comp := *f.Compensation
	s.Class, s.Compensation, s.Stuck = Compensable, &comp, ""
	return s, true
}

// stepTypes declares the event types of a step service: each type and
// its description, in pairs, published by service on stream with data
// [StepData].
func stepTypes(service, stream string, typeAndDescription ...string) []EventType {
	out := make([]EventType, 0, len(typeAndDescription)/2)
	for i := 0; i+1 < len(typeAndDescription); i += 2 {
		out = append(out, EventType{typeAndDescription[i], service, stream, "StepData", typeAndDescription[i+1]})
	}
	return out
}

// Full is [Default] with every [Optional] step on, in its usual place
// (insurance between the hotel and the payment), declaring besides its
// own types those of every other trip version ([Versions]: car.canceled
// of [ChargeLast]): the catalogue of every event type the system may
// publish, by which events are routed to their streams. Its steps are
// those of hotel,insurance,payment,car only, so it is not itself a
// version ([Catalogue.Validate] refuses the types no step of it
// publishes); the AsyncAPI document (events/asyncapi.yaml) is made from
// every version. It is built once (the outbox checks every event's
// subject against it); its slices are shared, read-only, as [Default]'s
// are.
func Full() Catalogue { return full() }

// FullSteps is the order of [Full]'s steps.
const FullSteps = "hotel,insurance,payment,car"

// FullOrders returns the catalogue of each declared order ([Orders]) with
// every [Optional] step on, in its usual place (the insurance after the
// hotel): hotel,insurance,payment,car and hotel,insurance,car,payment.
// Together they publish every type of [Full]; the AsyncAPI document says
// from them who publishes and consumes each.
func FullOrders() []Catalogue {
	out := []Catalogue{}
	for _, v := range []string{FullSteps, "hotel,insurance,car,payment"} {
		c, err := CatalogueOf(v)
		if err != nil {
			panic(err) // a declaration error in this file, caught by its test
		}
		out = append(out, c)
	}
	return out
}

var full = sync.OnceValue(func() Catalogue { //nolint:gochecknoglobals // built once, read-only
	c, err := ParseSteps(FullSteps)
	if err != nil {
		panic(err) // a declaration error in this file, caught by its test
	}
	c.Types = slices.Clone(c.Types)
	for _, v := range Versions() {
		for _, t := range v.Types {
			if _, ok := c.Lookup(t.Type); !ok {
				c.Types = append(c.Types, t)
			}
		}
	}
	return c
})

// Saga returns the catalogue's compensable steps and its pivot, in saga
// order (the forward-only steps after the pivot left out).
func (c Catalogue) Saga() []Step {
	var out []Step
	for _, s := range c.Steps {
		if s.Class != ForwardOnly {
			out = append(out, s)
		}
	}
	return out
}

// Services returns every service that owns a step or a projection of c,
// each once, in declaration order ("hotel", "payment", "car", "trips",
// "reconciler").
func (c Catalogue) Services() []string {
	var out []string
	add := func(s string) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, s := range c.Steps {
		add(s.Service)
	}
	for _, p := range c.Projections {
		add(p.Service)
	}
	return out
}

// Done returns the event type announcing that step s is done: the first
// of its Publishes (the one the next step is triggered by).
func (s Step) Done() string {
	if len(s.Publishes) == 0 {
		return ""
	}
	return s.Publishes[0]
}

// endings returns the event types that end step s without it being done
// (rejected, failed), that announce its compensation is done, and that
// announce its compensation is stuck ([Compensation.Stuck]): what the step
// before it is compensated on.
func (s Step) endings() []string {
	var out []string
	if len(s.Publishes) > 1 {
		out = append(out, s.Publishes[1:]...)
	}
	return append(out, s.UndoEvents()...)
}

// events returns every event type step s publishes, its compensation's included.
func (s Step) events() []string {
	return append(slices.Clone(s.Publishes), s.UndoEvents()...)
}

// clone returns a deep copy of s.
func (s Step) clone() Step {
	s.Trigger = slices.Clone(s.Trigger)
	s.Publishes = slices.Clone(s.Publishes)
	if s.Compensation != nil {
		comp := *s.Compensation
		comp.Trigger = slices.Clone(comp.Trigger)
		comp.Publishes = slices.Clone(comp.Publishes)
		s.Compensation = &comp
	}
	return s
}

// replace returns ts without the types in old, then with the types in new
// that it lacks: a trigger list rewired from one neighbour to another,
// keeping the triggers that do not come from the chain.
func replace(ts, old, new []string) []string {
	out := slices.DeleteFunc(slices.Clone(ts), func(t string) bool { return slices.Contains(old, t) })
	for _, t := range new {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// WithSteps returns c with its saga steps (compensable steps and the
// pivot) in order, which names each of c's saga steps once and may add
// [Optional] ones; the forward-only steps stay after the pivot. The order
// declares the pivot: it is the last step named that can be one (it is
// declared the pivot, or [Forms] gives it a pivot role: car, payment);
// every step before it is compensable, in its declared role or the one
// [Forms] gives it (the car canceled by key). So "hotel,payment,car" is
// [Default] and "hotel,car,payment" ([ChargeLast]) makes the payment the
// pivot and the car compensable. The chain is rewired: each step is
// triggered by the done event (see [Step.Done]) of the one before it (the
// first by trip.requested), each compensation by the next step's endings
// (rejected, failed) and its undo's events, and a forward-only step
// triggered by the pivot's done event (confirm) by the new pivot's. The
// event types of an added step, or of a role [Forms] adds, are declared,
// and every projection that follows all of each of c's saga steps' events
// follows them too. The result is checked with [Catalogue.Validate].
//
// The error wraps [ErrInvalidCatalogue], names STEPS and the step for: an
// unknown or repeated step, one of c's steps left out, a step named
// before the pivot that has no compensation, and a compensable step
// placed after the pivot (after the pivot a trip only goes forward).
func (c Catalogue) WithSteps(order []string) (Catalogue, error) {
	base := c.Saga()
	pool := map[string]Step{}
	known := []string{}
	for _, s := range base {
		pool[s.Name] = s
		known = append(known, s.Name)
	}
	optTypes := map[string][]EventType{}
	after := map[string][]Step{}
	for _, o := range Optional {
		if _, ok := pool[o.Step.Name]; !ok {
			pool[o.Step.Name] = o.Step
			optTypes[o.Step.Name] = o.Types
			after[o.Step.Name] = o.After
			known = append(known, o.Step.Name)
		}
	}
	list := strings.Join(order, ",")
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s=%s: "+format, append([]any{ErrInvalidCatalogue, StepsVar, list}, args...)...)
	}
	last := -1 // the pivot: the last step named that can be one
	for i, name := range order {
		s, ok := pool[name]
		switch {
		case !ok:
			return Catalogue{}, bad("unknown step %q (want some of %s)", name, strings.Join(known, ", "))
		case slices.Contains(order[:i], name):
			return Catalogue{}, bad("step %s named twice", name)
		case canPivot(s):
			last = i
		}
	}
	for _, s := range base {
		if !slices.Contains(order, s.Name) {
			return Catalogue{}, bad("step %s is missing (only %s may be left out)", s.Name, strings.Join(slices.Sorted(maps.Keys(optTypes)), ", "))
		}
	}
	var pivots []string
	for _, name := range known {
		if canPivot(pool[name]) {
			pivots = append(pivots, name)
		}
	}
	if last < 0 {
		return Catalogue{}, bad("no step that can be the pivot is named (one of %s; the last named is the pivot)", strings.Join(pivots, ", "))
	}
	for i, name := range order {
		s := pool[name]
		switch {
		case i > last:
			return Catalogue{}, bad("%s step %s comes after the pivot %s: after the pivot a trip only goes forward, so put %s before %s",
				Compensable, name, order[last], name, order[last])
		case i < last:
			if _, ok := asCompensable(s); !ok {
				return Catalogue{}, bad("step %s comes before the pivot %s but has no compensation", name, order[last])
			}
		}
	}

	out := c // what the steps do not touch is kept as it is
	out.Types = slices.Clone(c.Types)
	out.Projections = nil
	steps := make([]Step, len(order))
	var dropped []string
	for i, name := range order {
		s := pool[name]
		if i == last {
			s = asPivot(s)
		} else {
			s, _ = asCompensable(s)
		}
		steps[i] = s.clone()
		if s.Class != pool[name].Class {
			optTypes[name] = append(slices.Clone(optTypes[name]), Forms[name].Types...)
			// The role given up takes its own event types with it (the
			// refund's payment.refunded, with the payment the pivot).
			for _, t := range pool[name].UndoEvents() {
				if !slices.Contains(s.UndoEvents(), t) {
					dropped = append(dropped, t)
				}
			}
		}
	}
	out.Types = slices.DeleteFunc(out.Types, func(t EventType) bool { return slices.Contains(dropped, t.Type) })
	// Every trigger a rewiring replaces: the chain's done events and its
	// endings in every role a step may take.
	everyRole := maps.Clone(pool)
	for name, s := range pool {
		if f := Forms[name]; f.Compensation != nil || f.Stuck != "" {
			if cs, ok := asCompensable(s); ok {
				everyRole[name+"/compensable"] = cs
			}
			if canPivot(s) {
				everyRole[name+"/pivot"] = asPivot(s)
			}
		}
	}
	for i := range steps {
		s := &steps[i]
		// Its trigger: whatever chain event triggered it before, replaced by
		// the done event of the step now before it.
		prev := TripRequested
		if i > 0 {
			prev = steps[i-1].Done()
		}
		s.Trigger = replace(s.Trigger, chainDone(everyRole), []string{prev})
		if s.Compensation != nil && i+1 < len(steps) {
			s.Compensation.Trigger = replace(s.Compensation.Trigger, chainEndings(everyRole), steps[i+1].endings())
		}
		for _, t := range optTypes[s.Name] {
			if _, ok := out.Lookup(t.Type); !ok {
				out.Types = append(out.Types, t)
			}
		}
	}
	for _, s := range c.Steps {
		if s.Class == ForwardOnly {
			s = s.clone()
			// A step after the pivot that waits for a chain step's done
			// event (confirm, on the pivot's) waits for the pivot's.
			if slices.ContainsFunc(s.Trigger, func(t string) bool { return slices.Contains(chainDone(everyRole), t) }) {
				s.Trigger = replace(s.Trigger, chainDone(everyRole), []string{steps[last].Done()})
			}
			steps = append(steps, s)
		}
	}
	// An added step's part after the pivot joins its siblings (the steps
	// with its trigger): whatever waits for all of theirs waits for its too.
	var joins [][2][]string // siblings' events, the added step's
	for _, name := range order {
		for _, a := range after[name] {
			var sib []string
			for _, s := range steps {
				if s.Class == ForwardOnly && slices.Equal(s.Trigger, a.Trigger) {
					sib = append(sib, s.Publishes...)
				}
			}
			for i := range steps {
				if len(sib) > 0 && containsAll(steps[i].Trigger, sib) {
					steps[i].Trigger = replace(steps[i].Trigger, nil, a.Publishes)
				}
			}
			joins = append(joins, [2][]string{sib, a.Publishes})
			steps = append(steps, a.clone())
		}
	}
	out.Steps = steps
	for _, p := range c.Projections {
		followsAll := len(base) > 0
		for _, s := range base {
			for _, t := range s.events() {
				followsAll = followsAll && slices.Contains(p.Consumes, t)
			}
		}
		p.Consumes = slices.DeleteFunc(slices.Clone(p.Consumes), func(t string) bool { return slices.Contains(dropped, t) })
		p.Publishes = slices.Clone(p.Publishes)
		if followsAll {
			for i, name := range order {
				if _, added := optTypes[name]; added {
					p.Consumes = replace(p.Consumes, nil, steps[i].events())
				}
			}
		}
		for _, j := range joins {
			if len(j[0]) > 0 && containsAll(p.Consumes, j[0]) {
				p.Consumes = replace(p.Consumes, nil, j[1])
			}
		}
		out.Projections = append(out.Projections, p)
	}
	// The operators' actions reach an added step's service too when they
	// reach every service of c's saga (retry an undo now, pause, resume).
	out.Operator.Consumers = slices.Clone(c.Operator.Consumers)
	reachesAll := len(base) > 0
	for _, s := range base {
		reachesAll = reachesAll && slices.Contains(c.Operator.Consumers, s.Service)
	}
	for _, name := range order {
		if _, added := optTypes[name]; added && reachesAll && !slices.Contains(out.Operator.Consumers, pool[name].Service) {
			out.Operator.Consumers = append(out.Operator.Consumers, pool[name].Service)
		}
	}
	if err := out.Validate(); err != nil {
		return Catalogue{}, fmt.Errorf("%s=%s: %w", StepsVar, list, err)
	}
	return out, nil
}

// containsAll reports whether ts holds every type of want.
func containsAll(ts, want []string) bool {
	for _, t := range want {
		if !slices.Contains(ts, t) {
			return false
		}
	}
	return true
}

// chainDone returns every step's done event: the triggers a rewiring replaces.
func chainDone(pool map[string]Step) []string {
	out := []string{TripRequested}
	for _, s := range pool {
		out = append(out, s.Done())
	}
	return out
}

// chainEndings returns every step's endings: the compensation triggers a
// rewiring replaces.
func chainEndings(pool map[string]Step) []string {
	var out []string
	for _, s := range pool {
		out = append(out, s.endings()...)
	}
	return out
}

// ParseSteps returns [Default] arranged by a STEPS value ("hotel,insurance,
// payment,car", spaces around names allowed); "" is Default itself. The
// error names STEPS and the step at fault (see [Catalogue.WithSteps]).
func ParseSteps(v string) (Catalogue, error) {
	if strings.TrimSpace(v) == "" {
		return Default, nil
	}
	var order []string
	for n := range strings.SplitSeq(v, ",") {
		order = append(order, strings.TrimSpace(n))
	}
	return Default.WithSteps(order)
}

// FromEnv returns the catalogue the environment's STEPS selects (see
// [ParseSteps]). Every process checks it at start (process.EnvFromOS) and
// refuses to start on an error.
func FromEnv() (Catalogue, error) { return ParseSteps(os.Getenv(StepsVar)) }

var selected struct { //nolint:gochecknoglobals // cache of FromEnv by the STEPS value
	sync.Mutex
	v   string
	c   Catalogue
	set bool
}

// Selected returns the catalogue of this process: [FromEnv], read again
// whenever STEPS changes. It panics on an invalid STEPS, which a process
// has refused at start (process.EnvFromOS) and a test must not set.
func Selected() Catalogue {
	v := os.Getenv(StepsVar)
	selected.Lock()
	defer selected.Unlock()
	if !selected.set || selected.v != v {
		c, err := ParseSteps(v)
		if err != nil {
			panic(err)
		}
		selected.v, selected.c, selected.set = v, c, true
	}
	return selected.c
}
