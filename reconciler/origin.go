package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/saga"
)

// originGuard parks what the step services park: a trigger event that
// one step service published for the next (hotel.held, payment.charged)
// is carried out only for a trip the trips service took, with the same
// request (saga.ServiceConfig.Origin), and the view must not show, as a
// trip stuck half-way, a trip that no step service acted on and nobody
// requested. It checks an event of a type [saga.OriginChecked] in its
// trip's version, and only while the trip's row has no trip.requested: a
// trigger that differs from a requested trip's request adds a kind the
// genuine event brings too, so the view is the same either way.
type originGuard struct {
	origin saga.OriginFunc // nil: nothing is checked
	grace  time.Duration
}

// needs reports whether e is an event g checks at all: a trigger a step
// service published. A version that cannot be read is applicable's to
// refuse, not g's.
func (g originGuard) needs(e event.Event) (events.Catalogue, bool) {
	if g.origin == nil {
		return events.Catalogue{}, false
	}
	c, err := events.CatalogueOf(events.VersionOf(e))
	if err != nil {
		return events.Catalogue{}, false
	}
	return c, saga.OriginChecked(c, e.Type())
}

// verdicts returns, by index into es (the events of one transaction
// tx), why each event g checks may not be projected yet: an error
// wrapping inbox.ErrPermanent when it never may, one wrapping
// saga.ErrOriginPending while its trip's trip.requested may still come
// back, another when the origin read failed. An event of a trip whose
// row records a trip.requested, or for which seen (when not nil) reports
// one, passes without a read; any other costs one JetStream read
// ([saga.CheckOrigin]). The error is that of the trip_view query.
func (g originGuard) verdicts(ctx context.Context, tx pgx.Tx, es []event.Event, seen func(trip string) bool) (map[int]error, error) {
	type pending struct {
		i int
		c events.Catalogue
	}
	var todo []pending
	var trips []string
	for i, e := range es {
		if c, ok := g.needs(e); ok && (seen == nil || !seen(e.Subject())) {
			todo = append(todo, pending{i, c})
			trips = append(trips, e.Subject())
		}
	}
	if len(todo) == 0 {
		return map[int]error{}, nil
	}
	requested, err := queries.TripViewListRequested(ctx, tx, trips)
	if err != nil {
		return nil, fmt.Errorf("trip_view requested: %w", err)
	}
	known := make(map[string]bool, len(requested))
	for _, t := range requested {
		known[t] = true
	}
	var out map[int]error
	for _, p := range todo {
		e := es[p.i]
		if known[e.Subject()] {
			continue
		}
		if err := saga.CheckOrigin(ctx, g.origin, p.c, e, g.grace); err != nil {
			if out == nil {
				out = map[int]error{}
			}
			out[p.i] = fmt.Errorf("event %s: %w", e.ID(), err)
		}
	}
	return out, nil
}

// check returns nil when the events es (of one transaction tx) may be
// projected now (see verdicts), else the first reason why not: one
// wrapping inbox.ErrPermanent parks the event it names (the inbox
// handles a failed batch's events one by one); any other is retried, as
// the step services retry a trigger whose trip.requested may still come
// back.
func (g originGuard) check(ctx context.Context, tx pgx.Tx, es ...event.Event) error {
	v, err := g.verdicts(ctx, tx, es, nil)
	if err != nil {
		return err
	}
	for i := range es {
		if err := v[i]; err != nil {
			return err
		}
	}
	return nil
}

// handlers returns the live projection's [inbox.HandlerFunc] and
// [inbox.BatchFunc], each holding the projection lock in shared mode so
// that a replay's clearing transaction never interleaves with it (see
// [Replay]), and each checking its events with g first.
func (g originGuard) handlers() (inbox.HandlerFunc, inbox.BatchFunc) {
	one := func(ctx context.Context, tx pgx.Tx, e event.Event) error {
		if err := queries.ProjectionLockShared(ctx, outbox.Later(tx)); err != nil {
			return fmt.Errorf("projection lock: %w", err)
		}
		if err := applicable(e); err != nil {
			return err
		}
		if err := g.check(ctx, tx, e); err != nil {
			return err
		}
		return apply(ctx, tx, e)
	}
	batch := func(ctx context.Context, tx pgx.Tx, _ string, ds []inbox.Delivery) error {
		if err := queries.ProjectionLockShared(ctx, outbox.Later(tx)); err != nil {
			return fmt.Errorf("projection lock: %w", err)
		}
		items := make([]replayItem, 0, len(ds))
		es := make([]event.Event, 0, len(ds))
		for _, d := range ds {
			if err := applicable(d.Event); err != nil {
				return err // handled alone, it is parked
			}
			items = append(items, replayItem{e: d.Event, stream: d.Stream, seq: d.Seq})
			es = append(es, d.Event)
		}
		if err := g.check(ctx, tx, es...); err != nil {
			return err // handled alone, each is parked or retried
		}
		_, _, err := applyItems(ctx, tx, items)
		return err
	}
	return one, batch
}

// replayOrigins is the replay's [originGuard], with the trips whose
// start event (trip.requested) the replay has read, so that their
// triggers need no JetStream read.
type replayOrigins struct {
	guard originGuard
	log   *slog.Logger
	seen  sync.Map // trip id -> struct{}
}

// read notes e's trip when e is its saga's start event.
func (o *replayOrigins) read(e event.Event) {
	if o.guard.origin == nil {
		return
	}
	c, err := events.CatalogueOf(events.VersionOf(e))
	if err == nil && c.Start != "" && e.Type() == c.Start {
		o.seen.Store(e.Subject(), struct{}{})
	}
}

// keep returns items less the triggers the live projection parks for
// good (see [originGuard.verdicts]); a trigger still within its grace is
// kept, as the live projection would project it once its trip.requested
// came back. A failed origin read is the error: the batch is not applied,
// and the replay fails (to be run again).
func (o *replayOrigins) keep(ctx context.Context, tx pgx.Tx, items []replayItem) ([]replayItem, error) {
	if o.guard.origin == nil {
		return items, nil
	}
	es := make([]event.Event, len(items))
	for i, it := range items {
		es[i] = it.e
	}
	v, err := o.guard.verdicts(ctx, tx, es, func(trip string) bool { _, ok := o.seen.Load(trip); return ok })
	if err != nil || len(v) == 0 {
		return items, err
	}
	kept := make([]replayItem, 0, len(items))
	for i, it := range items {
		switch err := v[i]; {
		case err == nil, errors.Is(err, saga.ErrOriginPending):
			kept = append(kept, it)
		case errors.Is(err, inbox.ErrPermanent):
			o.log.Info("reconciler: replay left out a trigger no trip.requested backs", "stream", it.stream, "stream_seq", it.seq, "err", err)
		default:
			return nil, fmt.Errorf("replay: %w", err)
		}
	}
	return kept, nil
}
