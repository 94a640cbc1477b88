package saga

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/outbox"
)

// BuildFunc returns the company request body of a step from the saga's
// id and its request, as JSON, the way the saga's first event carried it
// (the trip's: an events.TripRequest). An error parks the trigger event
// (inbox.ErrPermanent): a request that cannot be read or is invalid is
// never retried. Make one with [Builder], which decodes and checks the
// request as the saga's own type.
type BuildFunc func(sagaID string, request json.RawMessage) (any, error)

// Payload is a saga's request type: what its first event carries and
// every step event after it carries on (the trip's is
// events.TripRequest). Validate returns an error naming each field it
// refuses; events are untrusted input, so a step checks the request
// before any company is called.
type Payload interface {
	Validate() error
}

// Builder returns the [BuildFunc] of a step whose saga's request is of
// type R: the carried JSON is decoded into an R (an unknown field is an
// error: a request is never half understood) and checked with its
// Validate before build is called with it. The step is then the only
// place that knows the saga's words; the machinery carries the request
// unread.
func Builder[R Payload](build func(sagaID string, request R) (any, error)) BuildFunc {
	return func(sagaID string, raw json.RawMessage) (any, error) {
		var req R
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return nil, fmt.Errorf("request: %w", err)
		}
		if err := req.Validate(); err != nil {
			return nil, err
		}
		return build(sagaID, req)
	}
}

// ServiceConfig assembles a step service: one step, the inboxes of its
// trigger and compensation events (as the catalogue declares them), the
// outbox relay and the runner.
type ServiceConfig struct {
	Pool      *pgxpool.Pool
	JetStream jetstream.JetStream
	// Catalogue is the saga's catalogue this process runs (the trip's:
	// the order its STEPS gives, process.Env.Steps). Required.
	Catalogue events.Catalogue
	// Family is every catalogue an event of the saga may be of, by its
	// version: each trigger is handled by its own version's, and the
	// inboxes take what the step needs in any of them. Defaults to
	// events.Single(Catalogue), a saga of one version; the trip's
	// services run events.TripVersions().
	Family events.Family
	Spec   Spec
	Build  BuildFunc
	Timing Timing
	// Instance names this process among the service's replicas ("" =
	// $TRIPSAGA_INSTANCE, else "<host>:<service>"); see [Liveness].
	Instance   string
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Extra are further steps the service owns besides Spec (its part in
	// the customer's cancellation of a finished saga): each has its
	// own runner on the same step log, liveness and relay, and its
	// trigger events, as the catalogue declares them, come through the
	// service's inboxes.
	Extra []ExtraStep
	// Origin, when set, is how the service checks that a trigger event
	// published by another step service (not by trips) is about a trip
	// the trips service took, with the same request: a missing or
	// different trip.requested parks the event and nothing is called
	// ([OriginFunc]). It also lets an operator's undo_leak undo a done
	// step of a trip that has no trip.requested. Production sets
	// [TripsOrigin]; nil checks nothing.
	Origin OriginFunc
	// OriginGrace is how long after a trigger event's CloudEvents time a
	// missing trip.requested is taken as lost by the TRIPS stream rather
	// than never published: a stream can lose an event it acknowledged
	// (a power loss before its fsync, a message deleted by hand), and the
	// trips service's outbox publishes it again once the stream's
	// duplicate window has passed (outbox verify). Until then the trigger
	// is retried, not parked; after it, parked (a forged event, or one
	// whose trip.requested never came back; the inbox's MaxDeliver parks
	// it too). Defaults to [DefaultOriginGrace].
	OriginGrace time.Duration
}

// DefaultOriginGrace returns the streams' duplicate window
// (events.StreamDuplicateWindow) plus a minute: the time by which the
// trips service's outbox verify, every 10 s, has published again a
// trip.requested its stream lost.
func DefaultOriginGrace() time.Duration {
	w, _ := events.StreamDuplicateWindow() // a process refuses a bad value at start
	return w + time.Minute
}

// ExtraStep is a further step of a service ([ServiceConfig.Extra]):
// forward-only, triggered by events whose data is not a step's.
type ExtraStep struct {
	Spec Spec
	// Request returns the step to record for a trigger event. An error
	// wrapping inbox.ErrPermanent parks the event (nothing is called).
	Request func(e event.Event) (Request, error)
}

// Service is a running step service.
type Service struct {
	cfg    ServiceConfig
	Runner *Runner
	// Extra are the runners of [ServiceConfig.Extra], in its order.
	Extra   []*Runner
	relay   *outbox.Relay
	live    *Liveness
	inboxes []*inbox.Inbox
}

// tripEvent is the common shape of every trigger's data: trip.requested
// and the step events both carry "trip_id" and "request".
type tripEvent struct {
	TripID  string          `json:"trip_id"`
	Request json.RawMessage `json:"request"`
}

// NewService checks cfg against the catalogue and builds the service.
func NewService(cfg ServiceConfig) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.OriginGrace == 0 {
		cfg.OriginGrace = DefaultOriginGrace()
	}
	if cfg.Family == nil {
		cfg.Family = events.Single(cfg.Catalogue)
	}
	step, ok := cfg.Catalogue.Step(cfg.Spec.Name)
	if !ok {
		return nil, fmt.Errorf("%w: step %q is not in the catalogue", ErrInvalidConfig, cfg.Spec.Name)
	}
	// A saga step is compensable or the pivot by the order (STEPS, and
	// each saga's version): step c is the pivot of a,b,c and compensable
	// in a,c,b. Only forward-only is fixed.
	if sagaStep(step.Class) != sagaStep(cfg.Spec.Class) || step.Service != cfg.Spec.Service {
		return nil, fmt.Errorf("%w: step %q is %s of %s in the catalogue", ErrInvalidConfig, step.Name, step.Class, step.Service)
	}
	if step.Compensation != nil && cfg.Spec.OnUndone == "" {
		return nil, fmt.Errorf("%w: step %q is compensable in the catalogue (STEPS) but its Spec has no OnUndone event", ErrInvalidConfig, step.Name)
	}
	if cfg.Spec.OnStuck == "" {
		// The catalogue's stuck event: the step before is undone on it.
		cfg.Spec.OnStuck = step.StuckType()
	}
	// What the step may publish in any trip version: its undo's event of
	// an order where it is compensable (its OnUndone) too.
	var declared []string
	for _, c := range slices.Concat(cfg.Family.All(), []events.Catalogue{cfg.Catalogue}) {
		if st, ok := c.Step(cfg.Spec.Name); ok {
			declared = appendNew(declared, st.Publishes...)
			declared = appendNew(declared, st.UndoEvents()...)
		}
	}
	for _, typ := range []string{cfg.Spec.OnDone, cfg.Spec.OnRejected, cfg.Spec.OnFailed, cfg.Spec.OnUndone, cfg.Spec.OnStuck} {
		if typ != "" && !slices.Contains(declared, typ) {
			return nil, fmt.Errorf("%w: step %q would publish %s, which the catalogue does not declare for it", ErrInvalidConfig, step.Name, typ)
		}
	}
	if cfg.Build == nil {
		return nil, fmt.Errorf("%w: Build is required", ErrInvalidConfig)
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{
		Pool: cfg.Pool, JetStream: cfg.JetStream, Logger: cfg.Logger, Registerer: cfg.Registerer,
		Catalogue: cfg.Family.Union(),
		EnsureStreams: func(ctx context.Context) error {
			n, _ := events.StreamReplicas()
			return events.EnsureServiceStreams(ctx, cfg.JetStream, cfg.Catalogue, cfg.Spec.Service, n)
		},
	})
	if err != nil {
		return nil, err
	}
	live := NewLiveness(cfg.Pool, cfg.Spec.Service, cfg.Instance, cfg.Logger)
	r, err := New(Config{Pool: cfg.Pool, Spec: cfg.Spec, Timing: cfg.Timing, Liveness: live, Relay: relay, Logger: cfg.Logger, Registerer: cfg.Registerer, Origin: cfg.Origin, Family: cfg.Family})
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, Runner: r, relay: relay, live: live}
	metrics, err := inbox.NewMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	// The inboxes take what the step needs in any trip version
	// (events.ConsumesAnyVersion), not only in this process's STEPS: a
	// trip keeps the version it started with, and a step's trigger and
	// its compensation's differ between versions (an optional step on or
	// off).
	// Each event is then handled by its trip's catalogue (below).
	all := []string{}
	for _, c := range slices.Concat(cfg.Family.All(), []events.Catalogue{cfg.Catalogue}) {
		if st, ok := c.Step(cfg.Spec.Name); ok {
			all = appendNew(all, st.Trigger...)
			if st.Compensation != nil {
				all = appendNew(all, st.Compensation.Trigger...)
			}
		}
	}
	extra := map[string][]func(ctx context.Context, tx pgx.Tx, e event.Event) error{}
	for _, x := range cfg.Extra {
		xs, ok := cfg.Catalogue.Step(x.Spec.Name)
		if !ok || xs.Class != events.ForwardOnly || xs.Service != cfg.Spec.Service || x.Spec.Service != cfg.Spec.Service || x.Spec.Class != events.ForwardOnly {
			return nil, fmt.Errorf("%w: extra step %q is not a forward-only step of %s in the catalogue", ErrInvalidConfig, x.Spec.Name, cfg.Spec.Service)
		}
		if x.Spec.OnDone != "" && !slices.Contains(xs.Publishes, x.Spec.OnDone) {
			return nil, fmt.Errorf("%w: step %q would publish %s, which the catalogue does not declare for it", ErrInvalidConfig, xs.Name, x.Spec.OnDone)
		}
		if x.Request == nil {
			return nil, fmt.Errorf("%w: extra step %q needs Request", ErrInvalidConfig, x.Spec.Name)
		}
		xr, err := New(Config{Pool: cfg.Pool, Spec: x.Spec, Timing: cfg.Timing, Liveness: live, Relay: relay, Logger: cfg.Logger, Registerer: cfg.Registerer})
		if err != nil {
			return nil, err
		}
		s.Extra = append(s.Extra, xr)
		request := x.Request
		name := x.Spec.Name
		for _, t := range xs.Trigger {
			if !slices.Contains(all, t) {
				all = append(all, t)
			}
			extra[t] = append(extra[t], func(ctx context.Context, tx pgx.Tx, e event.Event) error {
				cat, err := cfg.Family.Of(events.VersionOf(e))
				if err != nil {
					return fmt.Errorf("%w: %s of trip %s: %w", inbox.ErrPermanent, e.Type(), e.Subject(), err)
				}
				if cat.ReactionOf(name, e.Type()) != events.Run {
					// Not a step of the trip's version (the undo of an
					// optional step the trip was taken without).
					return nil
				}
				req, err := request(e)
				if err != nil {
					return err
				}
				if req.TripID != e.Subject() {
					return fmt.Errorf("%w: %s names trip %q, not its subject %q", inbox.ErrPermanent, e.Type(), req.TripID, e.Subject())
				}
				req.Version = events.VersionOf(e)
				_, err = xr.Request(ctx, tx, req)
				return err
			})
		}
	}
	handler := func(ctx context.Context, tx pgx.Tx, e event.Event) error {
		if err := events.ValidateTripID(e.Subject()); err != nil {
			return fmt.Errorf("%w: subject: %w", inbox.ErrPermanent, err)
		}
		if fs, ok := extra[e.Type()]; ok {
			for _, f := range fs {
				if err := f(ctx, tx, e); err != nil {
					return err
				}
			}
			return nil
		}
		// The trip's own catalogue decides, not this process's STEPS:
		// whether the step is in the trip at all, and whether the event
		// is its trigger or its compensation's there. An event the step
		// does not react to in that version is acknowledged and recorded
		// in the inbox (a replay stays exact); so is every event of a
		// trip whose version leaves the step out, which is how a service
		// started for the first time leaves alone the trips from before
		// it existed.
		version := events.VersionOf(e)
		cat, err := cfg.Family.Of(version)
		if err != nil {
			return fmt.Errorf("%w: %s of trip %s: %w", inbox.ErrPermanent, e.Type(), e.Subject(), err)
		}
		switch cat.ReactionOf(cfg.Spec.Name, e.Type()) {
		case events.Run:
			return s.onTrigger(ctx, tx, e, cat)
		case events.Undo:
			return r.RequestUndoOf(ctx, tx, e.Subject(), version)
		}
		return nil
	}
	every := cfg.Family.Union() // declares every type any version may publish
	for stream, filters := range every.Streams(all) {
		var types []string
		for _, t := range all {
			if et, _ := every.Lookup(t); et.Stream == stream {
				types = append(types, t)
			}
		}
		in, err := inbox.New(inbox.Config{
			Name: cfg.Spec.Service, Stream: stream, FilterSubjects: filters, Types: types,
			Pool: cfg.Pool, JetStream: cfg.JetStream, Handler: handler, BatchApply: inbox.HandlerBatch(handler),
			Relay:  relay,
			Logger: cfg.Logger, Metrics: metrics,
		})
		if err != nil {
			return nil, err
		}
		s.inboxes = append(s.inboxes, in)
	}
	if err := s.addOperatorInbox(metrics); err != nil {
		return nil, err
	}
	return s, nil
}

// sagaStep reports whether class is of a saga step (compensable or the
// pivot), not forward-only.
func sagaStep(class events.StepClass) bool { return class != events.ForwardOnly }

// appendNew appends to ts each of more it lacks.
func appendNew(ts []string, more ...string) []string {
	for _, t := range more {
		if !slices.Contains(ts, t) {
			ts = append(ts, t)
		}
	}
	return ts
}

// onTrigger records the step for the trip of trigger e, whose catalogue
// (of its version) is cat.
func (s *Service) onTrigger(ctx context.Context, tx pgx.Tx, e event.Event, cat events.Catalogue) error {
	var d tripEvent
	if err := events.DecodeData(e, &d); err != nil {
		return err
	}
	if len(d.Request) == 0 || string(d.Request) == "null" || d.TripID == "" || d.TripID != e.Subject() {
		return fmt.Errorf("%w: %s carries no trip request for subject %q", inbox.ErrPermanent, e.Type(), e.Subject())
	}
	// Events are untrusted input too: the step's Build (a [Builder])
	// decodes the request as the saga's type and checks it (the trip's
	// with the API's rules that do not depend on the day) before any
	// company is called; an invalid one is parked, naming its fields.
	body, err := s.cfg.Build(d.TripID, d.Request)
	if err != nil {
		return fmt.Errorf("%w: %s of trip %s: %w", inbox.ErrPermanent, e.Type(), e.Subject(), err)
	}
	// A trigger another step service published is carried out only for a
	// trip the trips service took, with its request unchanged: a step
	// service's identity can publish its own events with any content.
	if s.cfg.Origin != nil && fromStepService(cat, e.Type()) {
		start, _ := cat.Lookup(cat.Start)
		if err := checkOrigin(ctx, s.cfg.Origin, start, e, s.cfg.OriginGrace, d.Request); err != nil {
			return err
		}
	}
	_, err = s.Runner.Request(ctx, tx, Request{TripID: d.TripID, Body: body, Carried: d.Request, Version: events.VersionOf(e)})
	return err
}

// fromStepService reports whether events of typ are published, in
// catalogue c, by another service than the one publishing the saga's
// start event (c.Start: trips, of trip.requested); false when c declares
// no start.
func fromStepService(c events.Catalogue, typ string) bool {
	et, _ := c.Lookup(typ)
	origin, ok := c.Lookup(c.Start)
	return ok && et.Service != origin.Service
}

// Check returns an error when one of the service's inboxes fails
// readiness (see inbox.Readiness: a stalled inbox fails it, one waiting
// for its stream to appear or the operators' inbox does not).
func (s *Service) Check(ctx context.Context) error {
	return inbox.CheckAll(ctx, s.inboxes...)
}

// Inboxes returns the service's inboxes (its triggers', its
// compensations', the operators' actions'), for readiness
// (process.Process.AddInboxes).
func (s *Service) Inboxes() []*inbox.Inbox { return s.inboxes }

// Run registers the process among the service's replicas ([Liveness]),
// runs the recovery pass, calls ready, then runs the runner, the relay and
// the inboxes until ctx ends or one of them fails. Any number of replicas
// may run at once: they share the durable consumers and the outbox, and
// take each other's leases only when their owner is dead.
func (s *Service) Run(ctx context.Context, ready func()) error {
	if err := s.live.Start(ctx); err != nil {
		return err
	}
	// After every call has finished (g.Wait): peers then take what is
	// left at once.
	defer s.live.Close()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.live.Run(ctx) })
	g.Go(func() error { return s.relay.Run(ctx) })
	n, err := s.Runner.RecoveryPass(ctx)
	if err != nil {
		return fmt.Errorf("recovery pass: %w", err)
	}
	for _, x := range s.Extra {
		m, err := x.RecoveryPass(ctx)
		if err != nil {
			return fmt.Errorf("recovery pass: %w", err)
		}
		n += m
	}
	s.cfg.Logger.Info("recovery pass done", "rows", n)
	if ready != nil {
		ready()
	}
	g.Go(func() error { return s.Runner.Run(ctx) })
	for _, x := range s.Extra {
		g.Go(func() error { return x.Run(ctx) })
	}
	for _, in := range s.inboxes {
		g.Go(func() error { return in.Run(ctx) })
	}
	err = g.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
