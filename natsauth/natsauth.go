// Package natsauth defines, in one place, the NATS identity of every
// process of the system and what each may do, derived from the event
// catalogue (events.Catalogue): the subjects it may publish (its own
// events, its dead letters and exactly the JetStream API calls it needs)
// and subscribe to (its own inbox prefix, never the shared _INBOX.>).
// The embedded servers of the tests and of `tripsaga up`, the nodes of
// `tripsaga up --nats-cluster 3`, compose's server configuration
// (deploy/nats/nats-server.conf) and SECURITY.md's table are all made from
// these definitions.
//
// An identity is a NATS user nkey (github.com/nats-io/nkeys). A process
// finds its seed in the file NATS_CREDS names (see [ClientFromEnv]).
package natsauth

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tripsaga/tripsaga/events"
)

// Admin is the operator identity: the tools (doctor, replay, streams
// apply, the chaos and bench harnesses) and `tripsaga up`'s bootstrapping
// (it creates every stream before the services start). It may publish and subscribe to
// anything; no service process runs as it.
const Admin = "admin"

// InboxPrefixBase starts every identity's inbox prefix: "_INBOX_hotel"
// (inboxes "_INBOX_hotel.<nuid>"), set with nats.CustomInboxPrefix, so an
// identity subscribes only to its own replies.
const InboxPrefixBase = "_INBOX_"

// Consumer names one durable JetStream consumer: the inbox of Durable (a
// service) on Stream.
type Consumer struct {
	Stream  string
	Durable string
}

// Identity is one NATS user and what it may do. Every subject list is
// sorted.
type Identity struct {
	// Name is the service ("hotel") or [Admin].
	Name string
	// Events are the subjects of the events it publishes ("hotel.held.*",
	// the last token being the trip id).
	Events []string
	// DeadLetters are the subjects it parks events on:
	// "deadletter.<stream>.<name>" for each stream it consumes.
	DeadLetters []string
	// OwnStreams are the streams it creates and updates: those holding
	// its own events.
	OwnStreams []string
	// CreateStreams are streams it may create when missing, never update
	// (the server refuses a create with another configuration): the
	// dead-letter stream, for each service that parks events, so that
	// parking does not wait for anyone.
	CreateStreams []string
	// Consumers are its durable consumers: it creates, updates, reads,
	// deletes (to recreate), pulls from and acks only these.
	Consumers []Consumer
	// ReadStreams are the streams whose info and consumer list it reads
	// (the start check, internal/doctor, reads every stream), and where
	// it may ask for the info of a consumer of its own name (its lag
	// metrics ask on every stream).
	ReadStreams []string
	// GetStreams are the streams whose messages it may read by sequence
	// or last by subject (the oldest pending event of its consumers; for
	// a step service, the trip.requested of a trip in TRIPS; for a service
	// that consumes every stream, the reconciler, a trip's timeline and
	// the dead letters too).
	GetStreams []string
	// All: publish and subscribe to anything ([Admin]).
	All bool
}

// InboxPrefix is the identity's inbox prefix, "_INBOX_<name>".
func (id Identity) InboxPrefix() string { return InboxPrefix(id.Name) }

// InboxPrefix is the inbox prefix of the identity name, "_INBOX_<name>".
func InboxPrefix(name string) string { return InboxPrefixBase + name }

// JetStreamAPI lists the JetStream API subjects the identity may publish
// (requests to the server, "$JS.API.<call>") and the ack subjects of its
// consumers ("$JS.ACK.<stream>.<consumer>.>", and the same with the domain
// and account hash tokens the server puts in since 2.10).
func (id Identity) JetStreamAPI() []string {
	if id.All {
		return []string{"$JS.>"}
	}
	out := []string{"$JS.API.INFO"}
	for _, s := range id.ReadStreams {
		out = append(out, "$JS.API.STREAM.INFO."+s, "$JS.API.CONSUMER.LIST."+s, "$JS.API.CONSUMER.INFO."+s+"."+id.Name)
	}
	for _, s := range id.GetStreams {
		out = append(out, "$JS.API.STREAM.MSG.GET."+s)
	}
	for _, s := range id.OwnStreams {
		// MSG.GET: the outbox's verify reads back by sequence what its
		// relay published (outbox.Relay.Verify).
		out = append(out, "$JS.API.STREAM.CREATE."+s, "$JS.API.STREAM.UPDATE."+s, "$JS.API.STREAM.MSG.GET."+s)
	}
	for _, s := range id.CreateStreams {
		out = append(out, "$JS.API.STREAM.CREATE."+s)
	}
	for _, c := range id.Consumers {
		sc := c.Stream + "." + c.Durable
		out = append(out,
			"$JS.API.CONSUMER.CREATE."+sc,
			"$JS.API.CONSUMER.CREATE."+sc+".>", // the form with one filter subject
			"$JS.API.CONSUMER.INFO."+sc,
			"$JS.API.CONSUMER.DELETE."+sc,
			"$JS.API.CONSUMER.MSG.NEXT."+sc,
			"$JS.ACK."+sc+".>",
			"$JS.ACK.*.*."+sc+".>",
		)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// PublishAllow is everything the identity may publish: its events, its
// dead letters and its JetStream API calls.
func (id Identity) PublishAllow() []string {
	if id.All {
		return []string{">"}
	}
	out := append(append(slices.Clone(id.Events), id.DeadLetters...), id.JetStreamAPI()...)
	slices.Sort(out)
	return slices.Compact(out)
}

// SubscribeAllow is everything the identity may subscribe to: its own
// inboxes ("_INBOX_<name>.>"), where JetStream answers its API calls and
// delivers what it pulls.
func (id Identity) SubscribeAllow() []string {
	if id.All {
		return []string{">"}
	}
	return []string{id.InboxPrefix() + ".>"}
}

// Permissions is the identity's server-side permissions (allow lists; a
// subject not allowed is refused with a permissions violation).
func (id Identity) Permissions() *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: id.PublishAllow()},
		Subscribe: &server.SubjectPermission{Allow: id.SubscribeAllow()},
	}
}

// Services lists every service the catalogue names (publishers of types,
// owners of steps and projections), sorted.
func Services(c events.Catalogue) []string {
	var out []string
	for _, t := range c.Types {
		out = append(out, t.Service)
	}
	for _, s := range c.Steps {
		out = append(out, s.Service)
	}
	for _, p := range c.Projections {
		out = append(out, p.Service)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// allStreams is every stream of c, of every trip version (events.Full:
// a trip with insurance may still run after STEPS turned it off) and the
// dead-letter stream, sorted.
func allStreams(c events.Catalogue) []string {
	var out []string
	for s := range c.StreamSubjects() {
		out = append(out, s)
	}
	for s := range events.Full().StreamSubjects() {
		out = append(out, s)
	}
	out = append(out, events.StreamDeadLetter)
	slices.Sort(out)
	return slices.Compact(out)
}

// Identities derives every identity from c: one per service ([Services])
// and [Admin] last.
func Identities(c events.Catalogue) []Identity {
	var out []Identity
	streams := allStreams(c)
	for _, svc := range Services(c) {
		id := Identity{Name: svc, ReadStreams: streams}
		// What it publishes in any trip version, not only in c: the car's
		// car.canceled of a charge-last trip (events.Full declares it).
		for _, t := range append(slices.Clone(c.Types), events.Full().Types...) {
			if ev := events.Kind(t.Type) + ".*"; t.Service == svc && !slices.Contains(id.Events, ev) {
				id.Events = append(id.Events, ev)
			}
		}
		id.OwnStreams = c.OwnedStreams(svc)
		// What the service consumes in any trip version, not only in c:
		// a trip keeps the steps it started with (events.VersionExtension).
		consumed := events.Full().Streams(c.ConsumesAny(svc))
		for s := range consumed {
			id.Consumers = append(id.Consumers, Consumer{Stream: s, Durable: svc})
			id.DeadLetters = append(id.DeadLetters, events.DeadLetterSubjectPrefix+"."+s+"."+svc)
		}
		if len(id.Consumers) > 0 {
			id.CreateStreams = []string{events.StreamDeadLetter}
		}
		for s := range consumed {
			id.GetStreams = append(id.GetStreams, s)
		}
		// A step service reads a trip's trip.requested to check the origin
		// of the events that trigger it (saga.TripsOrigin).
		if tr, ok := c.Lookup(events.TripRequested); ok && ownsStep(c, svc) && !slices.Contains(id.GetStreams, tr.Stream) {
			id.GetStreams = append(id.GetStreams, tr.Stream)
		}
		if len(consumed) == len(streams)-1 { // every stream but DEADLETTER
			id.GetStreams = streams
		}
		slices.Sort(id.GetStreams)
		slices.Sort(id.Events)
		slices.Sort(id.DeadLetters)
		slices.SortFunc(id.Consumers, func(a, b Consumer) int { return strings.Compare(a.Stream, b.Stream) })
		out = append(out, id)
	}
	return append(out, Identity{Name: Admin, All: true, ReadStreams: streams, OwnStreams: streams, GetStreams: streams})
}

// ownsStep reports whether svc owns a step of c.
func ownsStep(c events.Catalogue, svc string) bool {
	for _, st := range c.Steps {
		if st.Service == svc {
			return true
		}
	}
	return false
}

// Lookup returns the identity called name among [Identities] of c.
func Lookup(c events.Catalogue, name string) (Identity, bool) {
	for _, id := range Identities(c) {
		if id.Name == name {
			return id, true
		}
	}
	return Identity{}, false
}

// MustLookup is [Lookup] for a name that must exist; it panics naming it
// otherwise (a programming error: a process name no catalogue knows).
func MustLookup(c events.Catalogue, name string) Identity {
	id, ok := Lookup(c, name)
	if !ok {
		panic(fmt.Sprintf("natsauth: no identity %q", name))
	}
	return id
}
