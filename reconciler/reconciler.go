// Package reconciler joins every service's event stream and the companies'
// own records to find half-finished trips.
//
// It has three parts:
//
//   - a projection, trip_view: one row per trip built from every event of
//     the saga (TRIPS, HOTEL, PAYMENT, CAR streams), through durable inbox
//     consumers named "reconciler", in any order and exactly once;
//   - a sweep, every [Config.Interval]: it pages through the hotel's holds,
//     the card processor's charges and the car firm's bookings, joins them
//     with trip_view by trip id and records findings (half, orphan, stuck)
//     that resolve themselves once no longer true;
//   - a dashboard on the process's HTTP mux (GET /, /findings,
//     /view/{trip_id}) and Prometheus gauges.
//
// [Replay] rebuilds trip_view from the streams.
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/reconciler/internal/dbsqlc"
	"github.com/tripsaga/tripsaga/saga"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// Defaults of [Config].
const (
	IntervalDefault    = 10 * time.Second
	StuckAfterDefault  = 120 * time.Second
	OrphanGraceDefault = 30 * time.Second
)

// Schema is the PostgreSQL schema of the reconciler process. It holds the
// saga migration set (for the inbox table) and the reconciler set.
const Schema = "reconciler"

// Config configures a [Reconciler].
type Config struct {
	// Pool reaches the reconciler's schema (search_path), migrated with
	// the saga and reconciler sets. Required.
	Pool *pgxpool.Pool
	// JetStream carries the events. Required.
	JetStream jetstream.JetStream
	// Companies list the companies' records, by the step whose company
	// each is ("hotel": [provider.Hotel], ...): one for every
	// compensable step and the pivot of Catalogue (an optional step's, the
	// insurer's, only when it is on). Required.
	Companies map[string]*provider.Client
	// RefundStep is the step whose undo may refund in part, its records
	// carrying refunded_cents (providers.md, "Partial refunds"): a trip
	// canceled by the traveler must be refunded exactly the charge minus
	// the fee there. Default "payment".
	RefundStep string
	// KeyNames are the names the steps' Idempotency-Keys use where they
	// are not the step's ("payment": "charge", providers.md): the trip
	// page asks a company by "<trip>:<name>" when no step row gives the
	// key. Default {"payment": "charge"}.
	KeyNames map[string]string
	// Interval between sweeps. Defaults to 10 s (RECONCILE_INTERVAL_MS for
	// the process).
	Interval time.Duration
	// StuckAfter: a trip not settled by a trip.confirmed or trip.canceled
	// event whose newest event is older than this is stuck. Defaults to
	// 120 s (STUCK_AFTER_MS for the process).
	StuckAfter time.Duration
	// OrphanGrace: an active company record created less than this long
	// ago (by its created_at, when the company gives one) is not yet an
	// orphan, since its trip.requested may still be on the way to us.
	// Defaults to 30 s.
	OrphanGrace time.Duration
	// Catalogue is the saga's steps in the order this system runs them
	// (STEPS, process.Env.Steps): the timeline's columns, the services that
	// carry out actions, the owners of steps. Zero: events.Default. A
	// trip is still judged by its own version's order.
	Catalogue events.Catalogue
	// Services are the base URLs of the services' operator endpoints, by
	// service name (see [ServiceURLsEnv]): timelines read their step logs
	// and incidents there, the search asks the trips service. Optional.
	Services map[string]string
	// Origin, when set, is how the projection checks, as the step
	// services do (saga.ServiceConfig.Origin), that a trigger one step
	// service published for another is about a trip the trips service
	// took: one that is not is parked on the dead-letter stream instead
	// of shown as a trip stuck half-way that nobody requested. Production
	// sets saga.TripsOrigin; nil checks nothing.
	Origin saga.OriginFunc
	// OriginGrace is how long after such an event's time a missing
	// trip.requested is taken as never published rather than lost by its
	// stream and published again (saga.ServiceConfig.OriginGrace): until
	// then the event is retried. Defaults to saga.DefaultOriginGrace.
	OriginGrace time.Duration
	// Registerer receives the gauges and inbox counters. Optional.
	Registerer prometheus.Registerer
	// Logger defaults to a discard logger.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Interval == 0 {
		c.Interval = IntervalDefault
	}
	if c.StuckAfter == 0 {
		c.StuckAfter = StuckAfterDefault
	}
	if c.OrphanGrace == 0 {
		c.OrphanGrace = OrphanGraceDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.OriginGrace == 0 {
		c.OriginGrace = saga.DefaultOriginGrace()
	}
	if len(c.Catalogue.Steps) == 0 {
		c.Catalogue = events.Default
	}
	if c.RefundStep == "" {
		c.RefundStep = "payment"
	}
	if c.KeyNames == nil {
		c.KeyNames = map[string]string{"payment": "charge"}
	}
}

func (c *Config) validate() error {
	switch {
	case c.Pool == nil || c.JetStream == nil:
		return fmt.Errorf("%w: Pool and JetStream are required", ErrInvalidConfig)
	case c.missingCompany() != "":
		return fmt.Errorf("%w: Companies has no client for step %s", ErrInvalidConfig, c.missingCompany())
	case c.Interval < 0 || c.StuckAfter < 0 || c.OrphanGrace < 0:
		return fmt.Errorf("%w: Interval, StuckAfter and OrphanGrace must not be negative", ErrInvalidConfig)
	}
	return nil
}

// missingCompany returns the first step of c.Catalogue that can be
// undone or fail (a compensable step or the pivot: its company holds what
// may be left half done) and that c.Companies has no client for, or "".
func (c *Config) missingCompany() string {
	for _, s := range c.Catalogue.Steps {
		if s.Class != events.ForwardOnly && c.Companies[s.Name] == nil {
			return s.Name
		}
	}
	return ""
}

// Reconciler is the projection, the sweep and the dashboard. Create it with
// [New] and run it with [Reconciler.Run].
type Reconciler struct {
	cfg     Config
	log     *slog.Logger
	inboxes []*inbox.Inbox
	metrics *metrics
	figures *figures
	sweepMu sync.Mutex
	last    atomic.Pointer[SweepResult]
	// pages are the console's templates, with cfg.Catalogue's actors
	// and owners.
	pages *template.Template
}

// New validates cfg (errors wrap [ErrInvalidConfig]), registers the
// metrics and builds one inbox consumer per stream the projection reads.
func New(cfg Config) (*Reconciler, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Reconciler{cfg: cfg, log: cfg.Logger, pages: consolePagesOf(cfg.Catalogue)}
	var err error
	if r.metrics, err = newMetrics(cfg.Registerer); err != nil {
		return nil, fmt.Errorf("reconciler: metrics: %w", err)
	}
	if r.figures, err = newFigures(cfg.Registerer, r); err != nil {
		return nil, fmt.Errorf("reconciler: metrics: %w", err)
	}
	handler, batch := r.observing(originGuard{origin: cfg.Origin, grace: cfg.OriginGrace}.handlers())
	inboxMetrics, err := inbox.NewMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("reconciler: inbox metrics: %w", err)
	}
	types := projectionTypes()
	batchLock := &sync.Mutex{}
	for stream, filters := range events.Full().Streams(types) {
		in, err := inbox.New(inbox.Config{
			Name: ProjectionName, Stream: stream, FilterSubjects: filters, Types: types,
			Pool: cfg.Pool, JetStream: cfg.JetStream, Handler: handler, BatchApply: batch, BatchLock: batchLock,
			Concurrency: 1, Logger: cfg.Logger, Metrics: inboxMetrics,
			// The projection never made the reconciler unready: a stream
			// not created yet, or an inbox in trouble, is a line of
			// /readyz (process.Process.AddInboxes).
			Optional: true,
		})
		if err != nil {
			return nil, fmt.Errorf("reconciler: inbox %s: %w", stream, err)
		}
		r.inboxes = append(r.inboxes, in)
	}
	return r, nil
}

// Inboxes returns the projection's inboxes, one per stream, for
// readiness (process.Process.AddInboxes); all are optional.
func (r *Reconciler) Inboxes() []*inbox.Inbox { return r.inboxes }

// Run consumes the streams into trip_view and sweeps every Interval (the
// first sweep right away) until ctx ends. ready, if set, is called once the
// consumers are starting. A failed sweep is logged and counted, not fatal.
func (r *Reconciler) Run(ctx context.Context, ready func()) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, in := range r.inboxes {
		g.Go(func() error { return in.Run(ctx) })
	}
	if ready != nil {
		ready()
	}
	g.Go(func() error { return r.sampleUnfinished(ctx) })
	g.Go(func() error {
		t := time.NewTicker(r.cfg.Interval)
		defer t.Stop()
		for {
			if _, err := r.Sweep(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("reconciler: sweep failed", "err", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	})
	err := g.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// TripView is one row of the projection.
type TripView struct {
	TripID string `json:"trip_id"`
	// Seen is the sorted set of event kinds seen ("hotel.held").
	Seen []string `json:"seen"`
	// Status is pending, confirmed, canceling or canceled (see [Status]).
	Status string `json:"status"`
	// Settled is "confirmed" or "canceled" once a trip.confirmed or
	// trip.canceled event was seen, else "".
	Settled string `json:"settled,omitempty"`
	// Requested: trip.requested was seen. Mailed: mail.sent was seen.
	Requested bool `json:"requested"`
	Mailed    bool `json:"mailed"`
	// Events is the number of distinct events applied.
	Events int `json:"events"`
	// FirstEventAt and LastEventAt are the events' own times (UTC).
	FirstEventAt time.Time `json:"first_event_at"`
	LastEventAt  time.Time `json:"last_event_at"`
	// Version is the trip's version (events.VersionExtension): the saga
	// order it started under and is judged by, "hotel,payment,car";
	// a trip whose events carry none is of the default order.
	Version string `json:"version"`
}

func tripViewFromRow(r dbsqlc.TripView) TripView {
	version := r.Version
	if version == "" {
		version = events.DefaultVersion()
	}
	return TripView{
		TripID: r.TripID, Seen: r.Seen, Status: r.Status, Settled: deref(r.Settled), Version: version,
		Requested: r.Requested, Mailed: r.Mailed, Events: int(r.Events),
		FirstEventAt: r.FirstEventAt.UTC(), LastEventAt: r.LastEventAt.UTC(),
	}
}

// Finding is something the sweep found wrong with a trip.
type Finding struct {
	ID     int64  `json:"id"`
	TripID string `json:"trip_id"`
	// Kind is [FindingHalf], [FindingOrphan], [FindingStuck],
	// [FindingUnattributed] or [FindingOpenUndo].
	Kind       string     `json:"kind"`
	Detail     string     `json:"detail"`
	FirstSeen  time.Time  `json:"first_seen"`
	LastSeen   time.Time  `json:"last_seen"`
	ResolvedAt *time.Time `json:"resolved_at,omitempty"`
	// DismissedAt, DismissedBy and DismissReason say when, who and why an
	// operator dismissed it (events.ActionDismiss): it still holds, but no
	// longer counts as open.
	DismissedAt   *time.Time `json:"dismissed_at,omitempty"`
	DismissedBy   string     `json:"dismissed_by,omitempty"`
	DismissReason string     `json:"dismiss_reason,omitempty"`
}

func findingFromRow(r dbsqlc.Finding) Finding {
	f := Finding{ID: r.ID, TripID: r.TripID, Kind: r.Kind, Detail: r.Detail, FirstSeen: r.FirstSeen.UTC(), LastSeen: r.LastSeen.UTC()}
	if r.ResolvedAt != nil {
		t := r.ResolvedAt.UTC()
		f.ResolvedAt = &t
	}
	if r.DismissedAt != nil {
		t := r.DismissedAt.UTC()
		f.DismissedAt, f.DismissedBy, f.DismissReason = &t, deref(r.DismissedBy), deref(r.DismissReason)
	}
	return f
}

// View returns the projection of one trip, or [ErrTripNotFound].
func (r *Reconciler) View(ctx context.Context, tripID string) (TripView, error) {
	row, err := queries.TripViewGet(ctx, r.cfg.Pool, tripID)
	if errors.Is(err, pgx.ErrNoRows) {
		return TripView{}, fmt.Errorf("%w: %q", ErrTripNotFound, tripID)
	}
	if err != nil {
		return TripView{}, fmt.Errorf("trip_view %s: %w", tripID, err)
	}
	return tripViewFromRow(row), nil
}

// Findings returns the open findings, oldest first; with all, the newest
// 1000 findings, resolved ones too.
func (r *Reconciler) Findings(ctx context.Context, all bool) ([]Finding, error) {
	var rows []dbsqlc.Finding
	var err error
	if all {
		rows, err = queries.FindingList(ctx, r.cfg.Pool, 1000)
	} else {
		rows, err = queries.FindingListOpen(ctx, r.cfg.Pool)
	}
	if err != nil {
		return nil, fmt.Errorf("findings: %w", err)
	}
	out := make([]Finding, 0, len(rows))
	for _, row := range rows {
		out = append(out, findingFromRow(row))
	}
	return out, nil
}

// Run runs the reconciler process (tripsaga serve reconciler): schema
// "reconciler", the projection, the sweep and the dashboard, configured by
// NATS_URL, DATABASE_URL, HTTP_ADDR, HOTEL_URL, PAYMENTS_URL, CARS_URL,
// INSURER_URL (when STEPS names insurance),
// RECONCILE_INTERVAL_MS (default 10000), STUCK_AFTER_MS (default
// 120000) and OPERATOR_TOKEN (the bearer token of operators' actions;
// unset, actions are disabled).
func Run(ctx context.Context, env process.Env) error {
	if err := env.Require("NATS_URL", "DATABASE_URL", "HTTP_ADDR", "HOTEL_URL", "PAYMENTS_URL", "CARS_URL"); err != nil {
		return fmt.Errorf("reconciler: %w", err)
	}
	interval, err := envMillis("RECONCILE_INTERVAL_MS")
	if err != nil {
		return err
	}
	stuck, err := envMillis("STUCK_AFTER_MS")
	if err != nil {
		return err
	}
	services, err := ParseServiceURLs(os.Getenv(ServiceURLsEnv))
	if err != nil {
		return fmt.Errorf("reconciler: %w", err)
	}
	p, err := process.Open(ctx, "reconciler", Schema, env, true, tripsql.SetSaga, tripsql.SetReconciler)
	if err != nil {
		return fmt.Errorf("reconciler: %w", err)
	}
	defer p.Close()
	if err := p.ExportState(ProjectionName); err != nil {
		return fmt.Errorf("reconciler: metrics: %w", err)
	}
	companies := map[string]*provider.Client{
		"hotel": provider.Hotel(env.CompanyURL("hotel")), "payment": provider.Payments(env.CompanyURL("payment")), "car": provider.Cars(env.CompanyURL("car")),
	}
	if _, on := env.Steps().Step("insurance"); on {
		if err := env.Require("INSURER_URL"); err != nil {
			return fmt.Errorf("reconciler: the insurance step is on: %w", err)
		}
	}
	if env.CompanyURL("insurance") != "" {
		// Listed whenever it is known, not only with the step on in
		// STEPS: trips of a version with insurance are still judged by
		// their policies after STEPS turned it off (and a policy of a
		// trip without it is half).
		companies["insurance"] = provider.Insurer(env.CompanyURL("insurance"))
	}
	r, err := New(Config{
		Pool: p.Pool, JetStream: p.JS, Companies: companies, Catalogue: env.Steps(),
		Interval: interval, StuckAfter: stuck, Services: services, Registerer: p.Registry, Logger: p.Log,
		// The view shows a trigger from a step service only for a trip
		// the trips service took, as the step services carry it out
		// (SECURITY.md).
		Origin: saga.TripsOrigin(p.JS),
	})
	if err != nil {
		return err
	}
	// The dashboard's views are operations views: on OPS_ADDR when set
	// (process.Process.OpsMux), otherwise on HTTP_ADDR.
	r.Register(p.OpsMux)
	op, err := NewOperator(OperatorConfig{Reconciler: r, Token: os.Getenv(OperatorTokenEnv), Registerer: p.Registry, Logger: p.Log})
	if err != nil {
		return err
	}
	op.Register(p.Mux)
	if p.OpsMux != p.Mux { // the dashboard's buttons post to where it is served
		op.Register(p.OpsMux)
	}
	p.AddInboxes(r.Inboxes)
	p.AddInboxes(op.Inboxes)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.Serve(ctx) })
	g.Go(func() error { return op.Run(ctx) })
	g.Go(func() error { return r.Run(ctx, p.SetReady) })
	return g.Wait()
}

// envMillis reads a duration in ms from the environment; empty is 0 (the
// default).
func envMillis(name string) (time.Duration, error) {
	s := os.Getenv(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("reconciler: %s=%q: want a number of ms", name, s)
	}
	return time.Duration(n) * time.Millisecond, nil
}
