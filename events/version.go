package events

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/cloudevents/sdk-go/v2/event"
)

// A trip's version is the saga order it started under: the names of its
// compensable steps and its pivot, in order, joined by commas
// ("hotel,insurance,payment,car"), which is the STEPS value that builds
// its catalogue ([ParseSteps]) and so its steps, their order, their
// triggers and their compensations. The trips service stamps it on
// trip.requested from its own STEPS ([Catalogue.Version]); every service
// copies it, from the event it reacts to, onto every event it publishes
// about the trip, and reacts to a trip's events by the catalogue of its
// version ([CatalogueOf]), not by its own STEPS: a trip started without
// insurance finishes without it after STEPS turned insurance on, and the
// other way round.
//
// It travels as the CloudEvents extension attribute [VersionExtension]
// (CloudEvents spec 1.0.2 §Extension Context Attributes: a lower-case
// alphanumeric name of at most 20 characters), in binary mode its own
// NATS header "ce-tripsteps" (the NATS protocol binding §3.1, see
// [EncodeHeaders]); the value needs no percent-encoding (letters, '_'
// and ','). The order itself is the version rather than a hash of the
// catalogue: it is what an operator reads on the timeline, and every
// other part of a catalogue follows from it and [Default].
//
// An event without it (published before versions existed) is of
// [Default]'s order, the only order there was before STEPS: so a
// step service started for the first time with a new step (insurance)
// never acts on history from before it existed, whose trips' versions
// do not name its step.
const VersionExtension = "tripsteps"

// maxVersionLen bounds a version read from an event (untrusted input):
// far above the longest order of every known step.
const maxVersionLen = 200

// Version returns c's saga order (its compensable steps and pivot, see
// [Catalogue.Saga]) as a trip's version: "hotel,payment,car" for
// [Default].
func (c Catalogue) Version() string {
	var names []string
	for _, s := range c.Saga() {
		names = append(names, s.Name)
	}
	return strings.Join(names, ",")
}

// DefaultVersion is [Default]'s version, the version of an event that
// carries none.
func DefaultVersion() string { return Default.Version() }

// VersionOf returns the trip version e carries ([VersionExtension]), or
// "" when it carries none (which means [DefaultVersion]).
func VersionOf(e event.Event) string {
	v, ok := e.Extensions()[VersionExtension]
	if !ok {
		return ""
	}
	s, _ := v.(string) // the codec sets every extension as a string
	return s
}

// SetVersion stamps e with the trip version v ([VersionExtension]); an
// empty v (a trip of before versions) leaves e without it.
func SetVersion(e *event.Event, v string) {
	if v != "" {
		e.SetExtension(VersionExtension, v)
	}
}

var versions struct { //nolint:gochecknoglobals // cache of CatalogueOf and Versions, read-only once built
	sync.Mutex
	byVersion map[string]Catalogue
	all       []Catalogue
}

// CatalogueOf returns the catalogue of a trip version (see
// [VersionExtension]): [ParseSteps] of it, "" being [Default]. A version
// comes from an event, so it is untrusted: the error wraps
// [ErrInvalidCatalogue] and names the step at fault, and a consumer parks
// the event. Catalogues are built once per version.
func CatalogueOf(version string) (Catalogue, error) {
	if len(version) > maxVersionLen {
		return Catalogue{}, fmt.Errorf("%w: trip version of %d bytes (at most %d)", ErrInvalidCatalogue, len(version), maxVersionLen)
	}
	versions.Lock()
	defer versions.Unlock()
	if c, ok := versions.byVersion[version]; ok {
		return c, nil
	}
	c, err := ParseSteps(version)
	if err != nil {
		return Catalogue{}, fmt.Errorf("trip version %q: %w", version, err)
	}
	if c.Version() != version && version != "" {
		// "hotel, payment,car" builds Default too, but is not how a
		// version is written: refuse it so one order has one version.
		return Catalogue{}, fmt.Errorf("%w: trip version %q is not canonical (want %q)", ErrInvalidCatalogue, version, c.Version())
	}
	if versions.byVersion == nil {
		versions.byVersion = map[string]Catalogue{}
	}
	versions.byVersion[version] = c
	return c, nil
}

// Versions returns the catalogue of every trip version a service must be
// ready for whatever its own STEPS: each of the declared [Orders]
// ([Default]'s and [ChargeLast]), and each with any of the [Optional]
// steps put anywhere before its pivot (as [Catalogue.WithSteps] accepts
// it), [Default] first. A service consumes what its steps need in any of
// them and in its own STEPS ([ConsumesAnyVersion]), so turning an
// optional step on or off, or switching to charge-last and back, needs no
// order of restarts. Another order of [Default]'s own steps
// ("payment,hotel,car") is not among them: every service must run it in
// its own STEPS before the trips service starts trips of it
// (docs/operating.md, "Configuration").
func Versions() []Catalogue {
	versions.Lock()
	defer versions.Unlock()
	if versions.all != nil {
		return versions.all
	}
	orders := slices.Clone(Orders)
	for _, o := range Optional {
		var more [][]string
		for _, order := range orders {
			for i := 0; i <= len(order); i++ {
				more = append(more, slices.Insert(slices.Clone(order), i, o.Step.Name))
			}
		}
		orders = append(orders, more...)
	}
	var out []Catalogue
	for _, order := range orders {
		if c, err := Default.WithSteps(order); err == nil {
			out = append(out, c)
		}
	}
	versions.all = out
	return out
}

// ConsumesAnyVersion returns every event type service consumes in any
// trip version: [Selected]'s [Catalogue.ConsumesAny].
func ConsumesAnyVersion(service string) []string { return Selected().ConsumesAny(service) }

// ConsumesAny returns every event type service consumes in c and in any
// trip version ([Versions], [Catalogue.Consumes]): what its inboxes
// subscribe to and its NATS identity may consume, so that a trip started
// under another STEPS than the service's own still reaches it.
func (c Catalogue) ConsumesAny(service string) []string {
	var out []string
	for _, v := range append(Versions(), c) {
		for _, t := range v.Consumes(service) {
			if !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	return out
}

// Reaction says what a step does with an event of a trip, by the trip's
// catalogue: [Catalogue.ReactionOf].
type Reaction int

const (
	// Ignore: the step is not in the trip's version, or the event is
	// neither its trigger nor its compensation's in that version. The
	// event is acknowledged and recorded in the inbox, so a replay stays
	// exact.
	Ignore Reaction = iota
	// Run: the event triggers the step.
	Run
	// Undo: the event triggers the step's compensation.
	Undo
)

// ReactionOf returns what step name does with an event of type typ in c
// (a trip's catalogue, [CatalogueOf]).
func (c Catalogue) ReactionOf(name, typ string) Reaction {
	s, ok := c.Step(name)
	if !ok {
		return Ignore
	}
	if slices.Contains(s.Trigger, typ) {
		return Run
	}
	if s.Compensation != nil && slices.Contains(s.Compensation.Trigger, typ) {
		return Undo
	}
	return Ignore
}

// ProjectionAnyVersion returns the projection called name with the event
// types it consumes in any trip version ([Versions] and [Selected]): what
// its inboxes subscribe to (the trips status follows the insurer's events
// of a trip with insurance after STEPS turned it off). False when no
// version declares it.
func ProjectionAnyVersion(name string) (Projection, bool) {
	var out Projection
	found := false
	for _, c := range append(Versions(), Selected()) {
		for _, p := range c.Projections {
			if p.Name != name {
				continue
			}
			if !found {
				out = p
				out.Consumes = slices.Clone(p.Consumes)
				out.Publishes = slices.Clone(p.Publishes)
				found = true
				continue
			}
			for _, t := range p.Consumes {
				if !slices.Contains(out.Consumes, t) {
					out.Consumes = append(out.Consumes, t)
				}
			}
		}
	}
	return out, found
}
