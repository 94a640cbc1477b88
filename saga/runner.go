package saga

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/outbox"
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
	// version's catalogue makes its step compensable (step c of the
	// order a,c,b where a,b,c makes it the pivot). Nil: a pivot Spec is
	// never undone.
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
	// uow writes the step log and its events (steplog.go).
	uow outbox.UnitOfWork
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
		uow: outbox.UnitOfWork{Pool: cfg.Pool, Relay: cfg.Relay,
			// The fault point between the step log's COMMIT and its
			// events' local publish: relays claim them after LocalGrace.
			Committed: func(ctx context.Context) bool { return fault.HitSite(ctx, fault.AfterLog) == nil }},
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
