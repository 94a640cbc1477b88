package saga

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/internal/tracing"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

var queries = dbsqlc.New() //nolint:gochecknoglobals // stateless

// Config configures a [Runner].
type Config struct {
	// Pool reaches the service's schema (search_path set). Required.
	Pool *pgxpool.Pool
	// Spec declares the step. Required.
	Spec Spec
	// Timing of calls, retries and undo; zero fields take defaults.
	Timing Timing
	// MaxInFlight bounds concurrent company calls. Defaults to 64.
	MaxInFlight int
	// Liveness, when set, is this process's membership among the
	// service's replicas: the leases the runner takes name it as owner,
	// and the runner ends early (and takes) the leases of dead replicas:
	// at start, in the recovery pass, and every [BeatInterval]. While it
	// is fenced (no beat confirmed for [FenceAfter]) the runner claims
	// nothing and starts no company call. When nil, a lease ends only
	// when its time runs out (2 × CallTimeout + 1 s).
	Liveness *Liveness
	// Relay, when set, is the process's outbox relay: it publishes the
	// events the runner writes right after their commit
	// (outbox.WithAfterCommit).
	Relay *outbox.Relay
	// Logger defaults to a discard logger.
	Logger *slog.Logger
	// Registerer, when set, receives the runner's metrics.
	Registerer prometheus.Registerer
	// Origin, when set, lets an operator's undo_leak undo a done step
	// whose trip has no trip.requested (an orphan no trip owns); nil
	// refuses it as for any done step. See [ServiceConfig.Origin].
	Origin OriginFunc
	// Family, when set, is every catalogue of the saga by version
	// ([ServiceConfig.Family]): a pivot Spec is undone in a saga whose
	// version's catalogue makes its step compensable (the car in
	// hotel,car,payment). Nil: a pivot Spec is never undone.
	Family events.Family
}

// Runner executes one step from its step log.
type Runner struct {
	cfg  Config
	born time.Time
	t    Timing
	log  *slog.Logger
	wake chan struct{}
	sem  chan struct{}
	wg   sync.WaitGroup
	full atomic.Bool // dispatch found every in-flight slot taken
	// lastVerify is when claim last looked for rows to verify (unix ns):
	// at most once per PollInterval, not on every wake.
	lastVerify atomic.Int64
	// lastRelease is when releaseDead last ran (unix ns).
	lastRelease atomic.Int64
	// runCtx is Run's context while it runs: Request then records steps
	// as started and launches their calls after the trigger commits.
	runCtx atomic.Pointer[context.Context]
	// nextDue is when the soonest row is due (unix ns), as the last claim
	// that took fewer rows than it could read it; 0 when unknown.
	nextDue atomic.Int64
	// clock estimates the database's clock, which decides every lease
	// (see clock.go).
	clock  dbClock
	calls  *prometheus.CounterVec
	raised prometheus.Counter
}

// New returns a runner. It returns an error wrapping [ErrInvalidConfig]
// for a bad cfg.
func New(cfg Config) (*Runner, error) {
	cfg.Timing.setDefaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 64
	}
	if cfg.Spec.KeyName == "" {
		cfg.Spec.KeyName = cfg.Spec.Name
	}
	switch {
	case cfg.Pool == nil:
		return nil, fmt.Errorf("%w: Pool is required", ErrInvalidConfig)
	case cfg.Spec.Name == "" || cfg.Spec.Service == "" || cfg.Spec.Company == nil:
		return nil, fmt.Errorf("%w: Spec needs Name, Service and Company", ErrInvalidConfig)
	case cfg.Spec.Class != events.Compensable && cfg.Spec.Class != events.Pivot && cfg.Spec.Class != events.ForwardOnly:
		return nil, fmt.Errorf("%w: Spec.Class %q", ErrInvalidConfig, cfg.Spec.Class)
	case cfg.Timing.CallTimeout >= cfg.Timing.StepDeadline && cfg.Spec.Class != events.ForwardOnly:
		return nil, fmt.Errorf("%w: CallTimeout %s must be shorter than StepDeadline %s", ErrInvalidConfig, cfg.Timing.CallTimeout, cfg.Timing.StepDeadline)
	}
	r := &Runner{
		cfg:  cfg,
		born: time.Now(),
		t:    cfg.Timing,
		log:  cfg.Logger.With("step", cfg.Spec.Name),
		wake: make(chan struct{}, 1),
		sem:  make(chan struct{}, cfg.MaxInFlight),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tripsaga_step_calls_total", Help: "Company calls made by saga steps, by step, operation and outcome.",
			ConstLabels: prometheus.Labels{"step": cfg.Spec.Name},
		}, []string{"op", "outcome"}),
		raised: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tripsaga_incidents_raised_total", Help: "Incidents raised for a person.",
			ConstLabels: prometheus.Labels{"step": cfg.Spec.Name},
		}),
	}
	if cfg.Liveness != nil {
		cfg.Liveness.noteCallTimeout(cfg.Timing.CallTimeout)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.calls, r.raised} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("saga: metrics: %w", err)
			}
		}
	}
	return r, nil
}

// write stores evs in the outbox inside tx: with the process's relay
// (Config.Relay), checked against its saga's streams, else
// outbox.Write's.
func (r *Runner) write(ctx context.Context, tx pgx.Tx, evs ...event.Event) error {
	if r.cfg.Relay != nil {
		return r.cfg.Relay.Write(ctx, tx, evs...)
	}
	return outbox.Write(ctx, tx, evs...)
}

// Key returns the Idempotency-Key of the step for trip: "<trip>:<KeyName>".
func (r *Runner) Key(trip string) string { return trip + ":" + r.cfg.Spec.KeyName }

// Request is a step to do for one trip.
type Request struct {
	TripID string
	// Body is the company request; its sha256 is the request fingerprint.
	Body any
	// Carried is the saga's request (the trip's: an events.TripRequest),
	// as JSON, carried forward in the step's done event so the next
	// step's service needs nothing else; nil carries none. The runner
	// never reads inside it: only the step's [BuildFunc] knows its type.
	Carried json.RawMessage
	// KeyName overrides Spec.KeyName (e.g. "mail:confirmed").
	KeyName string
	// Version is the trip's version (events.VersionExtension), from the
	// event that asked for the step: every event the step publishes
	// carries it on. "" is a trip of before versions (the default order).
	Version string
}

// Request records the step inside tx (the trigger event's inbox
// transaction) and returns whether it was new. A row that exists already,
// including a voided one, is left alone. When ctx comes from
// outbox.WithAfterCommit and Run is running, the row is recorded as
// started and the company is called right after the commit; otherwise it
// is recorded as pending, and the caller calls [Runner.Wake] after commit
// (done for it with outbox.WithAfterCommit).
func (r *Runner) Request(ctx context.Context, tx pgx.Tx, req Request) (bool, error) {
	body, err := json.Marshal(req.Body)
	if err != nil {
		return false, fmt.Errorf("saga: %s body: %w", r.cfg.Spec.Name, err)
	}
	trip := []byte("null")
	if len(req.Carried) > 0 {
		if !json.Valid(req.Carried) {
			return false, fmt.Errorf("saga: %s of %s: the carried request is not JSON", r.cfg.Spec.Name, req.TripID)
		}
		trip = req.Carried
	}
	sum := sha256.Sum256(body)
	tp, ts := traceOf(ctx)
	key := r.Key(req.TripID)
	if req.KeyName != "" {
		key = req.TripID + ":" + req.KeyName
	}
	if rc := r.runCtx.Load(); rc != nil && (*rc).Err() == nil && outbox.InAfterCommit(ctx) {
		// The trigger's transaction takes the claim too: the row is
		// started, with a lease, and the call is made once it commits. A
		// crash before the call leaves a started row, which is asked
		// about again by key like any other.
		row, err := queries.StepInsertStarted(ctx, tx, dbsqlc.StepInsertStartedParams{
			TripID: req.TripID, Step: r.cfg.Spec.Name, IdempotencyKey: key,
			Request: body, Fingerprint: hex.EncodeToString(sum[:]), Trip: trip,
			DeadlineMs: ms(r.t.StepDeadline), LeaseMs: ms(r.leaseFor()), Owner: r.owner(),
			Traceparent: tp, Tracestate: ts, Version: req.Version,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("saga: record %s of %s: %w", r.cfg.Spec.Name, req.TripID, err)
		}
		outbox.AfterCommit(ctx, func() { r.launch(*rc, row) })
		return true, nil
	}
	n, err := queries.StepInsertIfAbsent(ctx, tx, dbsqlc.StepInsertIfAbsentParams{
		TripID: req.TripID, Step: r.cfg.Spec.Name, IdempotencyKey: key,
		Request: body, Fingerprint: hex.EncodeToString(sum[:]), Trip: trip,
		DeadlineMs: ms(r.t.StepDeadline), Traceparent: tp, Tracestate: ts, Version: req.Version,
	})
	if err != nil {
		return false, fmt.Errorf("saga: record %s of %s: %w", r.cfg.Spec.Name, req.TripID, err)
	}
	if n == 1 {
		outbox.AfterCommit(ctx, r.Wake)
	}
	return n == 1, nil
}

// RequestUndo asks, inside tx, for the step of trip to be undone (its
// compensation). A step that is done or still unresolved becomes
// compensating; a step with no row is voided, so it never runs if its
// trigger comes later; a step already rejected, failed, undone or voided is
// left alone. Call [Runner.Wake] after commit (done for the caller when ctx
// comes from outbox.WithAfterCommit).
func (r *Runner) RequestUndo(ctx context.Context, tx pgx.Tx, trip string) error {
	return r.RequestUndoOf(ctx, tx, trip, "")
}

// RequestUndoOf is [Runner.RequestUndo] for a trip of version (the
// version of the event asking for the undo, events.VersionOf): a step
// voided before it ran says so with an event of that version. A row that
// exists keeps the version it was recorded with. A step compensable in
// one order and the pivot in another (the car: hotel,car,payment and
// hotel,payment,car) is undone only for a trip whose version makes it
// compensable; the pivot has no compensation.
func (r *Runner) RequestUndoOf(ctx context.Context, tx pgx.Tx, trip, version string) error {
	if !r.compensableIn(version) {
		return fmt.Errorf("saga: %s is %s and has no compensation", r.cfg.Spec.Name, r.cfg.Spec.Class)
	}
	outbox.AfterCommit(ctx, r.Wake)
	row, err := queries.StepGetForUpdate(ctx, tx, dbsqlc.StepGetForUpdateParams{TripID: trip, Step: r.cfg.Spec.Name})
	if errors.Is(err, pgx.ErrNoRows) {
		n, err := queries.StepInsertVoided(ctx, tx, dbsqlc.StepInsertVoidedParams{TripID: trip, Step: r.cfg.Spec.Name, IdempotencyKey: r.Key(trip), Version: version})
		if err != nil {
			return fmt.Errorf("saga: void %s of %s: %w", r.cfg.Spec.Name, trip, err)
		}
		if n == 0 {
			// The trigger's transaction recorded the step while we waited
			// on its row: undo that row instead.
			row, err = queries.StepGetForUpdate(ctx, tx, dbsqlc.StepGetForUpdateParams{TripID: trip, Step: r.cfg.Spec.Name})
			if err != nil {
				return fmt.Errorf("saga: undo %s of %s: %w", r.cfg.Spec.Name, trip, err)
			}
			return r.undoRow(ctx, tx, row)
		}
		// Nothing happened, so the undo is done at once; say so, or the
		// step before this one would never be undone.
		voided, err := queries.StepGetForUpdate(ctx, tx, dbsqlc.StepGetForUpdateParams{TripID: trip, Step: r.cfg.Spec.Name})
		if err != nil {
			return err
		}
		voided.Reason = new("voided: the undo came before the step")
		evs, err := r.event(r.cfg.Spec.OnUndone, &voided, false)
		if err != nil {
			return err
		}
		return r.write(ctx, tx, evs...)
	}
	if err != nil {
		return fmt.Errorf("saga: undo %s of %s: %w", r.cfg.Spec.Name, trip, err)
	}
	return r.undoRow(ctx, tx, row)
}

// compensableIn reports whether the runner's step has a compensation in
// a trip of version: a compensable Spec always; a pivot Spec when the
// version's catalogue (Config.Family) makes the step compensable and the
// Spec names its undo's event.
func (r *Runner) compensableIn(version string) bool {
	switch r.cfg.Spec.Class {
	case events.Compensable:
		return true
	case events.Pivot:
		if r.cfg.Family == nil || r.cfg.Spec.OnUndone == "" {
			return false
		}
		c, err := r.cfg.Family.Of(version)
		if err != nil {
			return false
		}
		st, ok := c.Step(r.cfg.Spec.Name)
		return ok && st.Compensation != nil
	}
	return false
}

func (r *Runner) undoRow(ctx context.Context, tx pgx.Tx, row dbsqlc.Step) error {
	switch Status(row.Status) {
	case Done, Pending, Unknown, Started:
		if Status(row.Status) != Started { // a call in flight keeps its lease
			now, err := r.dbNow(ctx, tx)
			if err != nil {
				return err
			}
			row.NextAttemptAt = now
		}
		row.Status = string(Compensating)
		row.UndoCause = new(CauseCompensation)
		// The undo's calls belong to the compensation's span from now on.
		if tp, ts := traceOf(ctx); tp != nil {
			row.Traceparent, row.Tracestate = tp, ts
		}
		return update(ctx, tx, row)
	default:
		return nil
	}
}

// launch calls the company for a row the trigger's transaction recorded
// as started, once a call slot is free.
func (r *Runner) launch(ctx context.Context, row dbsqlc.Step) {
	if ctx.Err() != nil {
		return // the lease ends and the next start's recovery pass asks again
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		select {
		case r.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		defer func() {
			<-r.sem
			if r.full.Swap(false) {
				r.Wake()
			}
		}()
		r.forward(ctx, row)
	}()
}

// idleMax bounds an idle runner's sleep: rows another process makes due
// without waking this one (a peer's crash leaves its leases to run out) are
// taken within it. 20 × PollInterval (10 s by default).
func (r *Runner) idleMax() time.Duration { return 20 * r.t.PollInterval }

// Running reports whether Run is running.
func (r *Runner) Running() bool {
	rc := r.runCtx.Load()
	return rc != nil && (*rc).Err() == nil
}

// Wake makes the runner look for due rows now.
func (r *Runner) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run works the step log until ctx ends: it claims due rows, calls the
// company and records what came back, waking on [Runner.Wake] and polling
// every PollInterval. In-flight calls finish before Run returns.
func (r *Runner) Run(ctx context.Context) error {
	r.runCtx.Store(&ctx)
	defer r.runCtx.Store(nil)
	t := time.NewTimer(r.t.PollInterval)
	defer t.Stop()
	defer r.wg.Wait()
	for {
		n, err := r.dispatch(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("saga: claim failed", "err", err)
		}
		if n > 0 && err == nil {
			continue
		}
		// Idle, sleep until the soonest row is due (the claim read it),
		// at most IdleMax: new rows of this process wake the runner.
		wait := r.t.PollInterval
		if nd := r.nextDue.Load(); nd != 0 && err == nil {
			wait = min(max(time.Until(time.Unix(0, nd)), time.Millisecond), r.idleMax())
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-r.wake:
		}
	}
}

// RecoveryPass finishes, now and synchronously, every row whose log says it
// is unfinished and due: pending steps are called, started and unknown
// ones are asked again by key (or undone past their deadline),
// compensations are retried, undone steps due for verification are checked.
// Services run it at start, before they report ready. It returns how many
// rows it worked on.
func (r *Runner) RecoveryPass(ctx context.Context) (int, error) {
	total := 0
	// Rows that are still unknown come due again during the pass; stop
	// taking new rounds after one lease so readiness is not held up by a
	// hanging company: Run goes on from there.
	stop := time.Now().Add(2*r.t.CallTimeout + time.Second)
	for first := true; first || time.Now().Before(stop); first = false {
		if r.cfg.Liveness.Fenced() {
			return total, nil // no call could be made; Run goes on once a beat commits
		}
		if err := r.releaseDead(ctx, true); err != nil {
			return total, err
		}
		jobs, err := r.claim(ctx, 64, first)
		if err != nil {
			return total, err
		}
		if len(jobs) == 0 {
			return total, nil
		}
		var wg sync.WaitGroup
		for _, j := range jobs {
			wg.Add(1)
			go func() { defer wg.Done(); j(ctx) }()
		}
		wg.Wait()
		total += len(jobs)
	}
	return total, nil
}

func (r *Runner) dispatch(ctx context.Context) (int, error) {
	if r.cfg.Liveness.Fenced() {
		return 0, nil // no call could be made; Liveness.Run says why
	}
	free := cap(r.sem) - len(r.sem)
	if free == 0 {
		r.full.Store(true)
		return 0, nil
	}
	if err := r.releaseDead(ctx, false); err != nil {
		return 0, err
	}
	jobs, err := r.claim(ctx, free, false)
	if err != nil {
		return 0, err
	}
	for _, j := range jobs {
		r.sem <- struct{}{}
		r.wg.Add(1)
		go func() {
			defer func() {
				<-r.sem
				r.wg.Done()
				if r.full.Swap(false) { // a slot is free for rows left waiting
					r.Wake()
				}
			}()
			j(ctx)
		}()
	}
	return len(jobs), nil
}

// releaseDead ends the leases of the service's dead replicas (see
// [Liveness]): now when force, else at most once per BeatInterval.
func (r *Runner) releaseDead(ctx context.Context, force bool) error {
	l := r.cfg.Liveness
	if l.ID() == 0 {
		return nil
	}
	now := time.Now().UnixNano()
	if last := r.lastRelease.Load(); !force && now-last < int64(BeatInterval) {
		return nil
	}
	r.lastRelease.Store(now)
	if _, err := l.ReleaseDeadLeases(ctx); err != nil {
		return err
	}
	return nil
}

// leaseFor is how long a claim's lease lasts: a job makes up to two calls
// (the call, then a status by key), each at most CallTimeout, plus 1 s.
func (r *Runner) leaseFor() time.Duration { return 2*r.t.CallTimeout + time.Second }

// owner is the id leases taken by this runner carry (nil without Liveness).
func (r *Runner) owner() *int32 {
	if id := r.cfg.Liveness.ID(); id != 0 {
		return &id
	}
	return nil
}

// claim takes up to max due rows in one transaction, writes each one's new
// state (started with attempts+1, or compensating with undo_attempts+1)
// with a lease owned by this process, commits, and returns the calls to
// make. verifyNow looks for undone rows to verify whatever the time since
// the last look.
func (r *Runner) claim(ctx context.Context, max int, verifyNow bool) ([]func(context.Context), error) {
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := queries.StepClaimDue(ctx, tx, dbsqlc.StepClaimDueParams{Step: r.cfg.Spec.Name, Max: int32(max)})
	if err != nil {
		return nil, fmt.Errorf("claim due: %w", err)
	}
	if rows, err = r.skipPaused(ctx, tx, rows, false); err != nil {
		return nil, err
	}
	// The transaction's now(), which StepClaimDue compared with: every
	// decision and lease of the claim is by the database's clock.
	now, err := r.dbNow(ctx, tx)
	if err != nil {
		return nil, err
	}
	// A job makes up to two calls (the call, then a status by key).
	// PostgreSQL keeps microseconds: a lease written as it will be read
	// back lets StepUpdate recognise the row (only_if_unchanged).
	lease := now.Add(r.leaseFor()).Truncate(time.Microsecond)
	owner := r.owner()
	var jobs []func(context.Context)
	for _, row := range rows {
		row.Owner = owner
		switch Status(row.Status) {
		case Pending, Started, Unknown:
			if r.cfg.Spec.Class != events.ForwardOnly && row.Attempts > 0 && !now.Before(row.DeadlineAt) {
				// Unknown by the deadline: undo by key.
				row.Status = string(Compensating)
				row.UndoCause = new(CauseDeadline)
				row.Outcome = new(fmt.Sprintf("still unknown at the deadline after %d calls", row.Attempts))
				r.log.Warn("saga: outcome unknown at deadline; undoing by key", "trip_id", row.TripID, "key", row.IdempotencyKey)
				row.UndoAttempts++
				row.NextAttemptAt = lease
				claimed := row
				jobs = append(jobs, func(ctx context.Context) { r.undo(ctx, claimed) })
				break
			}
			row.Status = string(Started)
			row.Attempts++
			if row.StartedAt == nil {
				row.StartedAt = &now
			}
			row.NextAttemptAt = lease
			claimed := row
			jobs = append(jobs, func(ctx context.Context) { r.forward(ctx, claimed) })
		case Compensating:
			row.UndoAttempts++
			row.NextAttemptAt = lease
			claimed := row
			jobs = append(jobs, func(ctx context.Context) { r.undo(ctx, claimed) })
		}
		if err := update(ctx, tx, row); err != nil {
			return nil, err
		}
	}
	if now := time.Now(); len(jobs) < max && (verifyNow || now.UnixNano()-r.lastVerify.Load() >= int64(r.t.PollInterval)) {
		r.lastVerify.Store(now.UnixNano())
		vrows, err := queries.StepClaimVerify(ctx, tx, dbsqlc.StepClaimVerifyParams{Step: r.cfg.Spec.Name, Max: int32(max - len(jobs))})
		if err != nil {
			return nil, fmt.Errorf("claim verify: %w", err)
		}
		if vrows, err = r.skipPaused(ctx, tx, vrows, true); err != nil {
			return nil, err
		}
		for _, row := range vrows {
			row.VerifyAt = &lease
			row.Owner = owner
			if err := update(ctx, tx, row); err != nil {
				return nil, err
			}
			claimed := row
			jobs = append(jobs, func(ctx context.Context) { r.verify(ctx, claimed) })
		}
	}
	if len(jobs) < max {
		inMs, err := queries.StepNextDue(ctx, tx, r.cfg.Spec.Name)
		if err != nil {
			return nil, fmt.Errorf("claim next due: %w", err)
		}
		// The database says in how long; the sleep is timed locally.
		r.nextDue.Store(time.Now().Add(time.Duration(inMs * float64(time.Millisecond))).UnixNano())
	} else {
		r.nextDue.Store(0)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("claim commit: %w", err)
	}
	return jobs, nil
}

// call makes one company call with its deadline CallTimeout from now, or
// none, returning [ErrFenced], once this process is fenced: a call started
// before the fence ends by the fence + CallTimeout, before any peer may
// take the row (see [FenceAfter]).
func (r *Runner) call(ctx context.Context, op string, f func(context.Context) (provider.Result, error)) (provider.Result, error) {
	now := time.Now()
	if at, ok := r.cfg.Liveness.FenceAt(); ok && !now.Before(at) {
		r.calls.WithLabelValues(op, "fenced").Inc()
		return provider.Result{}, ErrFenced
	}
	cctx, cancel := context.WithDeadline(ctx, now.Add(r.t.CallTimeout))
	defer cancel()
	res, err := f(cctx)
	outcome := string(res.Outcome)
	if err != nil {
		outcome = "unknown"
	}
	r.calls.WithLabelValues(op, outcome).Inc()
	return res, err
}

// startSpan starts the span of a job on a claimed row ("saga <step>
// <job>": forward, undo, verify) as a child of the trace context stored
// with the row (the span that asked for the step or its undo), so calls
// made later from the step log (the runner, retries, the recovery pass)
// belong to the trip's trace. A no-op span while tracing is off.
func (r *Runner) startSpan(ctx context.Context, job string, row *dbsqlc.Step) (context.Context, trace.Span) {
	if !tracing.Enabled() {
		return ctx, noop.Span{}
	}
	ctx = tracing.WithParentPtr(ctx, row.Traceparent, row.Tracestate)
	return tracing.Start(ctx, "saga "+r.cfg.Spec.Name+" "+job, trace.SpanKindInternal,
		tracing.KeyTripID.String(row.TripID), tracing.KeyStep.String(row.Step),
		tracing.KeyService.String(r.cfg.Spec.Service), tracing.KeyIdempotencyKey.String(row.IdempotencyKey),
		attribute.String("tripsaga.step.status", row.Status),
		attribute.Int("tripsaga.step.attempts", int(row.Attempts)), attribute.Int("tripsaga.step.undo_attempts", int(row.UndoAttempts)))
}

// traceOf is the trace context of ctx's span, as the step row stores it
// (nil while tracing is off).
func traceOf(ctx context.Context) (traceparent, tracestate *string) {
	tp, ts := tracing.Traceparent(ctx)
	if tp == "" {
		return nil, nil
	}
	traceparent = &tp
	if ts != "" {
		tracestate = &ts
	}
	return traceparent, tracestate
}

// leaseCovers reports whether what is left of a claimed row's lease covers
// the job's calls (up to two, each at most CallTimeout). A job that waited
// for a call slot past that renews the lease first, only if the row is
// still as claimed; when it is not (its lease ran out and another process,
// or this one, took the row, or an undo was asked for) the call is not
// made, so no two calls of one key are ever in flight.
//
// The lease is the database's time; what is left of it is judged by the
// database's clock as this runner last read it (dbClock: never later than
// the database's), and the renewed lease is the database's now() plus the
// lease.
func (r *Runner) leaseCovers(ctx context.Context, claimed *dbsqlc.Step) bool {
	if now, known := r.clock.estimate(); known && claimed.NextAttemptAt.Sub(now) >= 2*r.t.CallTimeout+250*time.Millisecond {
		return true
	}
	lease, err := queries.StepRenewLease(ctx, r.cfg.Pool, dbsqlc.StepRenewLeaseParams{
		TripID: claimed.TripID, Step: claimed.Step, Status: claimed.Status,
		Attempts: claimed.Attempts, UndoAttempts: claimed.UndoAttempts,
		WasLease: claimed.NextAttemptAt, LeaseMs: ms(r.leaseFor()),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err != nil || lease.IsZero() {
		r.log.Info("saga: a claimed call waited past its lease and the row changed meanwhile; not calling", "trip_id", claimed.TripID, "key", claimed.IdempotencyKey, "err", err)
		return false
	}
	claimed.NextAttemptAt = lease
	return true
}

// fenced reports, and logs, that a claimed job is abandoned because this
// process is fenced: nothing is called or written; the row's lease runs
// out, or a peer takes it after [Liveness.TakeoverAfter].
func (r *Runner) fenced(job string, claimed *dbsqlc.Step) bool {
	if !r.cfg.Liveness.Fenced() {
		return false
	}
	op := map[string]string{"forward": "do", "undo": "undo", "verify": "status"}[job]
	r.calls.WithLabelValues(op, "fenced").Inc()
	r.log.Warn("saga: fenced (liveness not confirmed): abandoning a claimed call; its lease runs out or a peer takes it", "job", job, "trip_id", claimed.TripID, "key", claimed.IdempotencyKey)
	return true
}

// forward calls the company for a claimed row (status started) and records
// the answer.
func (r *Runner) forward(ctx context.Context, claimed dbsqlc.Step) {
	if r.fenced("forward", &claimed) || !r.leaseCovers(ctx, &claimed) {
		return
	}
	ctx, span := r.startSpan(ctx, "forward", &claimed)
	defer span.End()
	ctx = fault.WithSite(ctx, r.cfg.Spec.Service, r.cfg.Spec.Name, false, claimed.TripID) // fault points <service>.<op>.<where>
	var body json.RawMessage = claimed.Request
	res, callErr := r.call(ctx, "do", func(ctx context.Context) (provider.Result, error) {
		return r.cfg.Spec.Company.Create(ctx, claimed.IdempotencyKey, body)
	})
	if callErr != nil && ctx.Err() == nil {
		res, callErr = r.learnForward(ctx, claimed.IdempotencyKey, body, res, callErr)
	}
	if ctx.Err() != nil {
		return // shutting down: the lease expires and the recovery pass asks again
	}
	if fault.HitSite(ctx, fault.AfterCall) != nil {
		return // as if the answer could not be recorded: asked again by key
	}
	err := r.inTx(ctx, claimed, func(tx pgx.Tx, row *dbsqlc.Step) ([]event.Event, error) {
		if Status(row.Status) != Started || row.Attempts != claimed.Attempts {
			// Undo was asked for meanwhile: keep what we learned.
			if callErr == nil && res.Outcome == provider.Done && res.Ref != "" {
				row.CompanyRef = &res.Ref
			}
			return nil, nil
		}
		now, err := r.dbNow(ctx, tx)
		if err != nil {
			return nil, err
		}
		if callErr != nil {
			row.Status = string(Unknown)
			row.LastError = new(callErr.Error())
			row.Outcome = new("unknown")
			next := now.Add(backoff(row.Attempts, r.t.RetryBackoffMin, r.t.RetryBackoffMax))
			if r.cfg.Spec.Class != events.ForwardOnly && next.After(row.DeadlineAt) {
				next = row.DeadlineAt
			}
			row.NextAttemptAt = next
			r.log.Info("saga: outcome unknown; will ask again by key", "trip_id", row.TripID, "key", row.IdempotencyKey, "attempt", row.Attempts, "err", callErr)
			// A company that answers about another key or amount, or
			// refuses our credentials, will not answer better when asked
			// again: a person is told at once, and the asking goes on.
			var mismatch *provider.MismatchError
			if errors.As(callErr, &mismatch) {
				if err := r.raise(ctx, tx, row, IncidentForwardAnswerMismatch, int(row.Attempts), callErr.Error()); err != nil {
					return nil, err
				}
			}
			var creds *provider.CredentialsError
			if errors.As(callErr, &creds) {
				if err := r.raise(ctx, tx, row, IncidentCompanyCredentials, int(row.Attempts), callErr.Error()); err != nil {
					return nil, err
				}
			}
			if r.cfg.Spec.Class == events.ForwardOnly && int(row.Attempts) >= r.t.IncidentAfter {
				return nil, r.raise(ctx, tx, row, IncidentForwardStuck, int(row.Attempts), callErr.Error())
			}
			return nil, nil
		}
		if row.LastError != nil {
			// An earlier attempt was unknown and may have raised an
			// incident: the step settles on a good answer now.
			if err := queries.IncidentResolve(ctx, tx, dbsqlc.IncidentResolveParams{TripID: row.TripID, Step: row.Step}); err != nil {
				return nil, err
			}
		}
		row.Outcome = new(fmt.Sprintf("%d %s", res.Code, res.Status))
		row.FinishedAt = &now
		row.LastError = nil
		switch res.Outcome {
		case provider.Done:
			row.Status = string(Done)
			row.CompanyRef = &res.Ref
			return r.event(r.cfg.Spec.OnDone, row, true)
		default:
			row.Status = string(Rejected)
			row.Reason = &res.Reason
			if r.cfg.Spec.Class == events.ForwardOnly {
				if err := r.raise(ctx, tx, row, IncidentForwardRefused, int(row.Attempts), res.Reason); err != nil {
					return nil, err
				}
			}
			return r.event(r.cfg.Spec.OnRejected, row, false)
		}
	})
	if err != nil {
		r.log.Error("saga: cannot record answer; the recovery pass will ask again by key", "trip_id", claimed.TripID, "err", err)
	}
	if callErr != nil {
		// Asked again after the backoff just written: the runner, which
		// may be sleeping until a later row, reads when that is.
		r.Wake()
	}
}

// learnForward asks the company's status by key (GET /<resource>/{key})
// after a forward call whose outcome is unknown: a resource in force means
// the step happened; a record of a rejection (Spec.RejectedStatus: a
// declined charge) is a rejection; anything else stays
// unknown and the same request is sent again later. The status is checked
// against body when the company is a [StatusChecker] (a charge answered
// with another amount is not in force for us). A status that fails is
// joined to callErr, so a mismatch or a credentials refusal met on either
// call raises its incident.
func (r *Runner) learnForward(ctx context.Context, key string, body any, res provider.Result, callErr error) (provider.Result, error) {
	st, err := r.call(ctx, "status", func(ctx context.Context) (provider.Result, error) {
		if sc, ok := r.cfg.Spec.Company.(StatusChecker); ok {
			return sc.StatusFor(ctx, key, body)
		}
		return r.cfg.Spec.Company.Status(ctx, key)
	})
	switch {
	case err != nil:
		return res, fmt.Errorf("%w; asked by key: %w", callErr, err)
	case st.Outcome != provider.Done:
		return res, callErr
	case st.Status == r.cfg.Spec.ActiveStatus:
		return st, nil
	case st.Status != "" && st.Status == r.cfg.Spec.RejectedStatus:
		return provider.Result{Outcome: provider.Rejected, Code: st.Code, Status: st.Status, Reason: r.cfg.Spec.RejectedReason}, nil
	}
	return res, callErr
}

// learnUndo asks the company's status by key after an undo whose outcome is
// unknown: no record, or a record no longer in force, means the undo is
// done (a record that appears later is caught by the verification). A
// status that fails is joined to callErr.
func (r *Runner) learnUndo(ctx context.Context, key string, res provider.Result, callErr error) (provider.Result, error) {
	st, err := r.call(ctx, "status", func(ctx context.Context) (provider.Result, error) {
		return r.cfg.Spec.Company.Status(ctx, key)
	})
	switch {
	case err != nil:
		return res, fmt.Errorf("%w; asked by key: %w", callErr, err)
	case st.Outcome == provider.None:
		return provider.Result{Outcome: provider.None, Code: st.Code, Status: "none"}, nil
	case st.Status != r.cfg.Spec.ActiveStatus:
		return provider.Result{Outcome: provider.Undone, Code: st.Code, Status: st.Status, Ref: st.Ref}, nil
	}
	return res, callErr
}

// undo calls the company's undo by key for a claimed compensating row.
func (r *Runner) undo(ctx context.Context, claimed dbsqlc.Step) {
	if r.fenced("undo", &claimed) || !r.leaseCovers(ctx, &claimed) {
		return
	}
	ctx, span := r.startSpan(ctx, "undo", &claimed)
	defer span.End()
	ctx = fault.WithSite(ctx, r.cfg.Spec.Service, r.cfg.Spec.Name, true, claimed.TripID)
	res, callErr := r.call(ctx, "undo", func(ctx context.Context) (provider.Result, error) {
		return r.cfg.Spec.Company.Undo(ctx, claimed.IdempotencyKey)
	})
	if callErr != nil && ctx.Err() == nil {
		res, callErr = r.learnUndo(ctx, claimed.IdempotencyKey, res, callErr)
	}
	if ctx.Err() != nil {
		return
	}
	if fault.HitSite(ctx, fault.AfterCall) != nil {
		return // as if the answer could not be recorded: retried by key
	}
	err := r.inTx(ctx, claimed, func(tx pgx.Tx, row *dbsqlc.Step) ([]event.Event, error) {
		if Status(row.Status) != Compensating || row.UndoAttempts != claimed.UndoAttempts {
			return nil, nil
		}
		now, err := r.dbNow(ctx, tx)
		if err != nil {
			return nil, err
		}
		var refused *provider.RefusedError
		if errors.As(callErr, &refused) {
			// A definitive answer, not an unknown one: say so at once and
			// ask again only rarely, until a person acts.
			row.LastError = new(callErr.Error())
			row.NextAttemptAt = now.Add(r.t.UndoBackoffMax)
			r.log.Error("saga: the company refused the undo; retrying at the longest backoff until a person acts", "trip_id", row.TripID, "key", row.IdempotencyKey, "attempt", row.UndoAttempts, "err", callErr)
			return r.raiseStuck(ctx, tx, row, IncidentCompensationRefused, callErr.Error())
		}
		if callErr != nil {
			row.LastError = new(callErr.Error())
			row.NextAttemptAt = now.Add(backoff(row.UndoAttempts, r.t.UndoBackoffMin, r.t.UndoBackoffMax))
			r.log.Warn("saga: undo failed; will retry", "trip_id", row.TripID, "key", row.IdempotencyKey, "attempt", row.UndoAttempts, "err", callErr)
			var mismatch *provider.MismatchError
			if errors.As(callErr, &mismatch) {
				// Never taken as undone; asking again will not fix it.
				if err := r.raise(ctx, tx, row, IncidentCompensationAnswerMismatch, int(row.UndoAttempts), callErr.Error()); err != nil {
					return nil, err
				}
			}
			if int(row.UndoAttempts) >= r.t.IncidentAfter {
				return r.raiseStuck(ctx, tx, row, IncidentCompensationStuck, callErr.Error())
			}
			return nil, nil
		}
		row.UndoneAt = &now
		row.LastError = nil
		row.Outcome = new(fmt.Sprintf("undo: %d %s", res.Code, res.Status))
		if res.Outcome == provider.None && row.Attempts > 0 && row.VerifyAt == nil {
			// The company never saw the key, but an earlier call may still
			// commit late: ask again later.
			v := now.Add(r.t.VerifyAfter)
			row.VerifyAt = &v
		}
		if err := queries.IncidentResolve(ctx, tx, dbsqlc.IncidentResolveParams{TripID: row.TripID, Step: row.Step}); err != nil {
			return nil, err
		}
		if row.UndoCause != nil && *row.UndoCause == CauseOperator {
			// An operator's undo of a leaked record: the trip settled long
			// ago; the action event and the operator log are the record.
			row.Status = string(Compensated)
			return nil, nil
		}
		if row.UndoCause != nil && *row.UndoCause == CauseDeadline {
			row.Status = string(Failed)
			return r.event(r.cfg.Spec.OnFailed, row, false)
		}
		row.Status = string(Compensated)
		return r.event(r.cfg.Spec.OnUndone, row, false)
	})
	if err != nil {
		r.log.Error("saga: cannot record undo; it will be retried by key", "trip_id", claimed.TripID, "err", err)
	}
	if callErr != nil {
		r.Wake() // retried after the backoff just written (see forward)
	}
}

// verify asks the company again about an undone step, in case it committed
// late, and undoes it again if it did. An answer that is unknown or breaks
// the contract (see provider.ErrUnknownOutcome) decides nothing: the
// question is asked again after VerifyAfter/2.
func (r *Runner) verify(ctx context.Context, claimed dbsqlc.Step) {
	if r.fenced("verify", &claimed) {
		return
	}
	ctx, span := r.startSpan(ctx, "verify", &claimed)
	defer span.End()
	res, callErr := r.call(ctx, "status", func(ctx context.Context) (provider.Result, error) {
		return r.cfg.Spec.Company.Status(ctx, claimed.IdempotencyKey)
	})
	if ctx.Err() != nil {
		return
	}
	err := r.inTx(ctx, claimed, func(tx pgx.Tx, row *dbsqlc.Step) ([]event.Event, error) {
		now, err := r.dbNow(ctx, tx)
		if err != nil {
			return nil, err
		}
		if callErr != nil {
			// Unknown, or an answer that breaks the contract: never taken
			// as "nothing there"; asked again.
			r.log.Warn("saga: verification unanswered; will ask again by key", "trip_id", row.TripID, "key", row.IdempotencyKey, "err", callErr)
			v := now.Add(r.t.VerifyAfter / 2)
			row.VerifyAt = &v
			return nil, nil
		}
		row.VerifyAt = nil
		undoneAt := now
		if row.UndoneAt != nil {
			undoneAt = *row.UndoneAt
		}
		if elapsed := now.Sub(undoneAt); res.Outcome != provider.Done && elapsed < r.t.VerifyHorizon {
			// Still nothing; a company may commit later yet: ask again,
			// each time after as long again as has passed (at most 10 min).
			v := now.Add(min(max(r.t.VerifyAfter, elapsed), 10*time.Minute))
			row.VerifyAt = &v
		}
		if res.Outcome == provider.Done && res.Status == r.cfg.Spec.ActiveStatus {
			r.log.Warn("saga: company committed after our undo; undoing again", "trip_id", row.TripID, "key", row.IdempotencyKey)
			row.Status = string(Compensating)
			row.Outcome = new("late commit found: " + res.Status)
			row.NextAttemptAt = now
			if res.Ref != "" {
				row.CompanyRef = &res.Ref
			}
		}
		return nil, nil
	})
	if err != nil {
		r.log.Error("saga: cannot record verification", "trip_id", claimed.TripID, "err", err)
	}
}

// inTx locks the row, lets f change it and name events, writes both, and
// commits.
func (r *Runner) inTx(ctx context.Context, claimed dbsqlc.Step, f func(tx pgx.Tx, row *dbsqlc.Step) ([]event.Event, error)) error {
	// Most often the row is still as claimed: write the answer without
	// reading it first, and read it only if it changed meanwhile.
	if done, err := r.inTxAsClaimed(ctx, claimed, f); done || err != nil {
		return err
	}
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	ctx, committed := outbox.WithAfterCommit(ctx, r.cfg.Relay)
	row, err := queries.StepGetForUpdate(ctx, tx, dbsqlc.StepGetForUpdateParams{TripID: claimed.TripID, Step: claimed.Step})
	if err != nil {
		return err
	}
	evs, err := f(tx, &row)
	if err != nil {
		return err
	}
	r.endLease(&row)
	if err := update(ctx, tx, row); err != nil {
		return err
	}
	if err := r.write(ctx, tx, evs...); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if fault.HitSite(ctx, fault.AfterLog) != nil {
		return nil // as if the local publish failed: relays claim the events after LocalGrace
	}
	committed()
	return nil
}

// inTxAsClaimed is inTx on the row as claimed, written only if it is
// still so (updateIf); it reports false, having changed
// nothing, when the row changed meanwhile.
func (r *Runner) inTxAsClaimed(ctx context.Context, claimed dbsqlc.Step, f func(tx pgx.Tx, row *dbsqlc.Step) ([]event.Event, error)) (bool, error) {
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	ctx, committed := outbox.WithAfterCommit(ctx, r.cfg.Relay)
	row := claimed
	evs, err := f(tx, &row)
	if err != nil {
		return false, err
	}
	r.endLease(&row)
	wrote, err := updateIf(ctx, tx, row, &claimed)
	if err != nil {
		return false, err
	}
	if !wrote {
		return false, nil
	}
	if err := r.write(ctx, tx, evs...); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	if fault.HitSite(ctx, fault.AfterLog) != nil {
		return true, nil // as if the local publish failed
	}
	committed()
	return true, nil
}

// endLease clears the owner of a row whose call's answer this runner
// writes: no call of it is in flight any more. A lease another replica
// took meanwhile is left as it is.
func (r *Runner) endLease(row *dbsqlc.Step) {
	if row.Owner != nil && *row.Owner == r.cfg.Liveness.ID() {
		row.Owner = nil
	}
}

func (r *Runner) event(typ string, row *dbsqlc.Step, carryTrip bool) ([]event.Event, error) {
	return r.eventBy(typ, row, carryTrip, "")
}

// eventBy is [Runner.event] of a step an operator settled by hand
// (settledBy names them; "" when the company answered).
func (r *Runner) eventBy(typ string, row *dbsqlc.Step, carryTrip bool, settledBy string) ([]event.Event, error) {
	if typ == "" {
		return nil, nil
	}
	d := events.StepData{TripID: row.TripID, Step: row.Step, IdempotencyKey: row.IdempotencyKey, SettledBy: settledBy}
	if row.CompanyRef != nil {
		d.CompanyRef = *row.CompanyRef
	}
	if row.Reason != nil {
		d.Reason = *row.Reason
	}
	if carryTrip && len(row.Trip) > 0 && string(row.Trip) != "null" {
		d.Request = json.RawMessage(row.Trip)
	}
	e, err := events.New(events.Source(r.cfg.Spec.Service), typ, row.TripID, d)
	if err != nil {
		return nil, err
	}
	// The trip's version goes on with every event of the step, so the
	// services after it react by the trip's catalogue (events.VersionOf).
	events.SetVersion(&e, row.Version)
	return []event.Event{e}, nil
}

func (r *Runner) raise(ctx context.Context, tx pgx.Tx, row *dbsqlc.Step, kind string, attempts int, lastErr string) error {
	inserted, err := queries.IncidentRaise(ctx, tx, dbsqlc.IncidentRaiseParams{
		TripID: row.TripID, Step: row.Step, Kind: kind, Attempts: int32(attempts), LastError: lastErr,
	})
	if err != nil {
		return fmt.Errorf("saga: raise incident: %w", err)
	}
	if inserted {
		r.raised.Inc()
		r.log.Error("saga: INCIDENT raised for a person; retries go on", "incident", kind, "trip_id", row.TripID, "key", row.IdempotencyKey, "attempts", attempts, "last_error", lastErr)
	}
	return nil
}

// raiseStuck raises the incident kind of an undo that is stuck (past
// IncidentAfter attempts) or refused for good, and returns, when this call
// raised it, the step's stuck event (Spec.OnStuck, e.g.
// payment.refund_stuck; see events.Compensation.Stuck), written in the
// same transaction: the step before is undone on it while this undo goes
// on retrying, so one stuck undo does not hold up the others. An
// operator's undo of a leaked record (CauseOperator) belongs to no
// running saga and publishes none.
func (r *Runner) raiseStuck(ctx context.Context, tx pgx.Tx, row *dbsqlc.Step, kind, lastErr string) ([]event.Event, error) {
	inserted, err := queries.IncidentRaise(ctx, tx, dbsqlc.IncidentRaiseParams{
		TripID: row.TripID, Step: row.Step, Kind: kind, Attempts: row.UndoAttempts, LastError: lastErr,
	})
	if err != nil {
		return nil, fmt.Errorf("saga: raise incident: %w", err)
	}
	if !inserted {
		return nil, nil
	}
	r.raised.Inc()
	r.log.Error("saga: INCIDENT raised for a person; retries go on", "incident", kind, "trip_id", row.TripID, "key", row.IdempotencyKey, "attempts", row.UndoAttempts, "last_error", lastErr)
	if row.UndoCause != nil && *row.UndoCause == CauseOperator {
		return nil, nil
	}
	if r.cfg.Spec.OnStuck != "" {
		r.log.Warn("saga: the undo is stuck; the steps before it are undone meanwhile, and it goes on retrying", "trip_id", row.TripID, "key", row.IdempotencyKey, "event", r.cfg.Spec.OnStuck)
	}
	return r.event(r.cfg.Spec.OnStuck, row, false)
}

func update(ctx context.Context, tx pgx.Tx, row dbsqlc.Step) error {
	_, err := updateIf(ctx, tx, row, nil)
	return err
}

// updateIf writes row; with was set, only if the stored row is still as
// was (StepUpdate's only_if_unchanged), and reports whether it wrote.
func updateIf(ctx context.Context, tx pgx.Tx, row dbsqlc.Step, was *dbsqlc.Step) (bool, error) {
	p := dbsqlc.StepUpdateParams{
		TripID: row.TripID, Step: row.Step, Status: row.Status, UndoCause: row.UndoCause,
		CompanyRef: row.CompanyRef, Outcome: row.Outcome, Reason: row.Reason,
		Attempts: row.Attempts, UndoAttempts: row.UndoAttempts, NextAttemptAt: row.NextAttemptAt,
		VerifyAt: row.VerifyAt, LastError: row.LastError, StartedAt: row.StartedAt,
		FinishedAt: row.FinishedAt, UndoneAt: row.UndoneAt, Owner: row.Owner,
		Traceparent: row.Traceparent, Tracestate: row.Tracestate,
	}
	if was != nil {
		p.OnlyIfUnchanged = true
		p.WasStatus, p.WasAttempts, p.WasUndoAttempts, p.WasVerifyAt = was.Status, was.Attempts, was.UndoAttempts, was.VerifyAt
	}
	n, err := queries.StepUpdate(ctx, tx, p)
	if err != nil {
		return false, fmt.Errorf("saga: update %s of %s: %w", row.Step, row.TripID, err)
	}
	return n == 1, nil
}

// Incident is a problem raised for a person (the Incident kinds of this
// package: compensation_stuck, compensation_refused, forward_stuck,
// forward_refused, forward_answer_mismatch, compensation_answer_mismatch,
// company_credentials). Retries go on while it is open.
type Incident struct {
	TripID     string     `json:"trip_id"`
	Step       string     `json:"step"`
	Kind       string     `json:"kind"`
	Attempts   int        `json:"attempts"`
	LastError  string     `json:"last_error"`
	RaisedAt   time.Time  `json:"raised_at"`
	ResolvedAt *time.Time `json:"resolved_at,omitempty"`
	// ResolvedBy and Resolution say who resolved it and why, when an
	// operator did (events.ActionResolve).
	ResolvedBy string `json:"resolved_by,omitempty"`
	Resolution string `json:"resolution,omitempty"`
	// Owner is who answers for it (the service's INCIDENT_OWNER, or the
	// service's name) and EscalatesAt when an open one escalates past
	// them (raised_at + INCIDENT_ESCALATE_AFTER_MS), Escalated whether it
	// has, by the database's clock. Set by the service's GET /incidents.
	Owner       string     `json:"owner,omitempty"`
	EscalatesAt *time.Time `json:"escalates_at,omitempty"`
	Escalated   bool       `json:"escalated,omitempty"`
}

// Incidents lists every incident of the service whose schema db reaches,
// oldest first.
func Incidents(ctx context.Context, db dbsqlc.DBTX) ([]Incident, error) {
	rows, err := queries.IncidentListAll(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("saga: incidents: %w", err)
	}
	out := make([]Incident, 0, len(rows))
	for _, r := range rows {
		inc := Incident{TripID: r.TripID, Step: r.Step, Kind: r.Kind, Attempts: int(r.Attempts), LastError: r.LastError, RaisedAt: r.RaisedAt.UTC(), ResolvedAt: r.ResolvedAt}
		if r.ResolvedBy != nil {
			inc.ResolvedBy = *r.ResolvedBy
		}
		if r.Resolution != nil {
			inc.Resolution = *r.Resolution
		}
		out = append(out, inc)
	}
	return out, nil
}

// StepView is a step log row, for operators.
type StepView struct {
	TripID         string     `json:"trip_id"`
	Step           string     `json:"step"`
	IdempotencyKey string     `json:"idempotency_key"`
	Status         string     `json:"status"`
	UndoCause      string     `json:"undo_cause,omitempty"`
	CompanyRef     string     `json:"company_ref,omitempty"`
	Outcome        string     `json:"outcome,omitempty"`
	Reason         string     `json:"reason,omitempty"`
	Attempts       int        `json:"attempts"`
	UndoAttempts   int        `json:"undo_attempts"`
	LastError      string     `json:"last_error,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	FinishedAt     *time.Time `json:"finished_at,omitempty"`
	UndoneAt       *time.Time `json:"undone_at,omitempty"`
}

// Steps returns the step log rows of a trip.
func Steps(ctx context.Context, db dbsqlc.DBTX, trip string) ([]StepView, error) {
	rows, err := queries.StepListByTrip(ctx, db, trip)
	if err != nil {
		return nil, fmt.Errorf("saga: steps of %s: %w", trip, err)
	}
	s := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	out := make([]StepView, 0, len(rows))
	for _, r := range rows {
		out = append(out, StepView{
			TripID: r.TripID, Step: r.Step, IdempotencyKey: r.IdempotencyKey, Status: r.Status, UndoCause: s(r.UndoCause),
			CompanyRef: s(r.CompanyRef), Outcome: s(r.Outcome), Reason: s(r.Reason), Attempts: int(r.Attempts),
			UndoAttempts: int(r.UndoAttempts), LastError: s(r.LastError), CreatedAt: r.CreatedAt.UTC(), FinishedAt: r.FinishedAt, UndoneAt: r.UndoneAt,
		})
	}
	return out, nil
}
