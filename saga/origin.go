package saga

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
)

// OriginFunc returns the request (as JSON) of trip's trip.requested
// event, the record that the trips service took the trip, or nil (and no
// error) when there is none. Any other error is transient: the caller retries it.
//
// A step service that has one ([ServiceConfig.Origin]) carries out a
// trigger event published by another step service (stock.reserved,
// card.charged, ...) only when its trip has a trip.requested carrying
// the same request: only the trips identity may publish trip.requested
// (natsauth), so a step service's leaked seed can no longer
// invent a trip or change its request. An operator's undo_leak of a done
// step is carried out only when there is none (see [Runner.Operate]).
type OriginFunc func(ctx context.Context, trip string) (json.RawMessage, error)

// TripsOrigin is the trip's [OriginFunc]: [OriginOf] events.Default,
// which reads the last message on "trip.requested.<trip>" of the TRIPS
// stream.
func TripsOrigin(js jetstream.JetStream) OriginFunc { return OriginOf(js, events.Default) }

// OriginOf is the [OriginFunc] of a saga of catalogue c: it reads, through
// js, the last message on the subject of c's start event (c.Start) for
// the saga's id, in the stream c declares for it (one JetStream
// get-last-message-by-subject request, $JS.API.STREAM.MSG.GET.<stream>,
// after the first call has looked up the stream), and returns its
// "request". A stored start event that cannot be decoded, or c without
// a start event, is a permanent error (inbox.ErrPermanent).
func OriginOf(js jetstream.JetStream, c events.Catalogue) OriginFunc {
	var (
		mu     sync.Mutex
		stream jetstream.Stream
	)
	start, declared := c.Lookup(c.Start)
	return func(ctx context.Context, trip string) (json.RawMessage, error) {
		if !declared {
			return nil, fmt.Errorf("%w: the catalogue declares no start event (Catalogue.Start %q)", inbox.ErrPermanent, c.Start)
		}
		subject, err := events.Subject(start.Type, trip)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", inbox.ErrPermanent, err)
		}
		mu.Lock()
		s := stream
		mu.Unlock()
		if s == nil {
			if s, err = js.Stream(ctx, start.Stream); err != nil {
				return nil, fmt.Errorf("saga: stream %s: %w", start.Stream, err)
			}
			mu.Lock()
			stream = s
			mu.Unlock()
		}
		m, err := s.GetLastMsgForSubject(ctx, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("saga: read %s: %w", subject, err)
		}
		e, err := events.Decode(m.Header, m.Data)
		if err != nil {
			return nil, fmt.Errorf("%w: stored %s cannot be decoded: %w", inbox.ErrPermanent, subject, err)
		}
		var d struct {
			Request json.RawMessage `json:"request"`
		}
		if err := events.DecodeData(e, &d); err != nil {
			return nil, fmt.Errorf("%w: stored %s: %w", inbox.ErrPermanent, subject, err)
		}
		if len(d.Request) == 0 || string(d.Request) == "null" {
			return nil, fmt.Errorf("%w: stored %s carries no request", inbox.ErrPermanent, subject)
		}
		return d.Request, nil
	}
}

// ErrOriginPending is wrapped by the transient error of [CheckOrigin]
// (and of a step service's check) while a trigger's start event is
// missing but the trigger is younger than the grace: the start event's
// stream may have lost it, and its outbox publishes it again.
var ErrOriginPending = errors.New("saga: start event not found yet")

// checkOrigin returns nil when the start event (read with origin; the
// trip's trip.requested, declared as start) of trigger e's saga carries a
// request equal to req (as JSON values: the same members and values, in
// any order and spacing); a wrapped inbox.ErrPermanent naming why not
// when it differs, or when it is missing and e's time is more than grace
// ago; a transient error wrapping [ErrOriginPending] when it is missing
// within grace (its stream may have lost it: see
// [ServiceConfig.OriginGrace]); else origin's error.
func checkOrigin(ctx context.Context, origin OriginFunc, start events.EventType, e event.Event, grace time.Duration, req json.RawMessage) error {
	typ, trip := e.Type(), e.Subject()
	want, err := origin(ctx, trip)
	if err != nil {
		return fmt.Errorf("%s of trip %s: origin: %w", typ, trip, err)
	}
	if want == nil {
		kind := events.Kind(start.Type) // "trip.requested": of a trip
		entity, _, _ := strings.Cut(kind, ".")
		if age := time.Since(e.Time()); age < grace {
			return fmt.Errorf("%w: %s: no %s for %s yet, %s after the event: the %s stream may have lost it and the %s service's outbox publishes it again; asking again until %s after the event", ErrOriginPending, typ, kind, trip, age.Round(time.Millisecond), start.Stream, start.Service, grace)
		}
		return fmt.Errorf("%w: %s: no %s for %s: not a %s the %s service took", inbox.ErrPermanent, typ, kind, trip, entity, start.Service)
	}
	if diff := requestDiff(want, req); len(diff) > 0 {
		return fmt.Errorf("%w: %s of trip %s: request differs from the trip's trip.requested: %s", inbox.ErrPermanent, typ, trip, strings.Join(diff, ", "))
	}
	return nil
}

// OriginChecked reports whether a step service checks the origin of
// events of typ, in catalogue c, before it carries them out (see
// [ServiceConfig.Origin]): typ is the trigger of one of c's steps and is
// published by another service than the one publishing c's start event.
// A projection that must not show what no step service carried out (the
// reconciler's view) checks the same events with [CheckOrigin].
func OriginChecked(c events.Catalogue, typ string) bool {
	if !fromStepService(c, typ) {
		return false
	}
	for _, s := range c.Steps {
		if c.ReactionOf(s.Name, typ) == events.Run {
			return true
		}
	}
	return false
}

// CheckOrigin checks trigger event e of catalogue c as a step service
// does before it records its step: e's data carries a request and the
// trip id of its subject, and the start event (c.Start, read with
// origin) carries the same request. It returns nil when e passes; an
// error wrapping inbox.ErrPermanent when it never will (no request, a
// different one, no start event more than grace after e's time); a
// transient error wrapping [ErrOriginPending] while the start event is
// missing within grace (its stream may have lost it:
// [ServiceConfig.OriginGrace]); origin's error when it fails.
func CheckOrigin(ctx context.Context, origin OriginFunc, c events.Catalogue, e event.Event, grace time.Duration) error {
	var d tripEvent
	if err := events.DecodeData(e, &d); err != nil {
		return fmt.Errorf("%w: %w", inbox.ErrPermanent, err)
	}
	if len(d.Request) == 0 || string(d.Request) == "null" || d.TripID == "" || d.TripID != e.Subject() {
		return fmt.Errorf("%w: %s carries no trip request for subject %q", inbox.ErrPermanent, e.Type(), e.Subject())
	}
	start, ok := c.Lookup(c.Start)
	if !ok {
		return fmt.Errorf("%w: the catalogue declares no start event (Catalogue.Start %q)", inbox.ErrPermanent, c.Start)
	}
	return checkOrigin(ctx, origin, start, e, grace, d.Request)
}

// requestDiff returns the JSON paths ("order.amount_cents") where the
// JSON values a and b differ, sorted; none when equal. One that is not
// JSON differs as a whole ("request") unless both are the same bytes.
func requestDiff(a, b json.RawMessage) []string {
	var ma, mb any
	if json.Unmarshal(a, &ma) != nil || json.Unmarshal(b, &mb) != nil {
		if bytes.Equal(a, b) {
			return nil
		}
		return []string{"request"}
	}
	var out []string
	jsonDiff("", ma, mb, &out)
	slices.Sort(out)
	return out
}

func jsonDiff(path string, a, b any, out *[]string) {
	ma, okA := a.(map[string]any)
	mb, okB := b.(map[string]any)
	if !okA || !okB {
		if !reflect.DeepEqual(a, b) {
			if path == "" {
				path = "request"
			}
			*out = append(*out, path)
		}
		return
	}
	keys := slices.Collect(maps.Keys(ma))
	for k := range mb {
		if _, ok := ma[k]; !ok {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		p := k
		if path != "" {
			p = path + "." + k
		}
		jsonDiff(p, ma[k], mb[k], out)
	}
}
