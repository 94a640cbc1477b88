package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/internal/tracing"
	"github.com/tripsaga/tripsaga/outbox/internal/dbsqlc"
)

// Relay defaults.
const (
	RelayBatchSizeDefault    = 1000
	RelayPollIntervalDefault = time.Second
	RelayMaxAttemptsDefault  = 50
	RelayBackoffMaxDefault   = 20 * time.Second
	RelayAckTimeoutDefault   = 10 * time.Second
	RelayRetentionDefault    = 24 * time.Hour
	RelayLocalGraceDefault   = 5 * time.Second
)

// ErrInvalidConfig is wrapped by constructors given a bad Config.
var ErrInvalidConfig = errors.New("outbox: invalid config")

// RelayConfig configures a [Relay].
type RelayConfig struct {
	// Pool reaches the service's schema (search_path set). Required.
	Pool *pgxpool.Pool
	// JetStream publishes. Required.
	JetStream jetstream.JetStream
	// BatchSize is how many rows one transaction claims and publishes
	// asynchronously. Defaults to 1000.
	BatchSize int
	// PollInterval is how often the relay looks for rows when no NOTIFY
	// woke it (a NOTIFY can be lost on reconnect) while rows wait; an idle
	// relay sleeps until the soonest row is due, at most 10 × PollInterval.
	// Defaults to 1 s.
	PollInterval time.Duration
	// MaxAttempts is how many refusals of one row by the server for what
	// the event is (CauseRefused: too large, bad headers) quarantine it, so
	// it is counted for a person instead of retried forever. Outages (every
	// other Cause: storage or limits exceeded, no stream, no leader, no
	// PubAck in time, no connection) never count. Defaults to 50.
	MaxAttempts int
	// BackoffMax caps the per-row retry backoff (100 ms doubling per
	// failure, refusals and outages counted apart). It must
	// stay well inside events.DuplicateWindow so that a re-publish is still
	// deduplicated. Defaults to 20 s.
	BackoffMax time.Duration
	// AckTimeout bounds the wait for a batch's PubAcks. Defaults to 10 s.
	AckTimeout time.Duration
	// Retention is how long published rows are kept before the relay
	// deletes them, hourly. Defaults to 24 h. While a row is kept, the
	// verify (VerifyInterval) publishes its event again if its stream
	// loses it; events stay in the streams for events.MaxAge.
	Retention time.Duration
	// VerifyInterval is how often the relay runs a [Verify] pass over the
	// rows still kept: the gap check of every kept row, and the read-back
	// of VerifyBatch rows. Defaults to 10 s; negative turns it off.
	VerifyInterval time.Duration
	// VerifyBatch is how many rows one pass reads back by sequence (never
	// read back first, then the longest ago). Defaults to 1000.
	VerifyBatch int
	// VerifyAgain is how long a row read back is left before it is read
	// back again. Defaults to 1 min.
	VerifyAgain time.Duration
	// LocalGrace is how long a row that the writer's own relay publishes
	// right after commit (see WithAfterCommit) is left out of every relay's
	// claims: past it, a row still unmarked (its process died, or its
	// publish failed) is claimed and published like any other. It must be
	// well inside events.DuplicateWindow. Defaults to 5 s.
	LocalGrace time.Duration
	// EnsureStreams, when set, is called when publishes fail for want of a
	// stream (CauseNoStream: a stream deleted at runtime), at most once per
	// 10 s, to create the service's streams again as its start does
	// (e.g. events.EnsureStreams); the waiting events then go out.
	EnsureStreams func(context.Context) error
	// Logger defaults to a discard logger.
	Logger *slog.Logger
	// Registerer, when set, receives the relay's Prometheus metrics.
	Registerer prometheus.Registerer
	// Catalogue declares the streams of the events written with this
	// relay ([Relay.Write], or [Write] in a context of [WithAfterCommit]
	// with it): every event type any version of the saga may publish (a
	// family's Union; the trip's is events.Full()). An event whose NATS
	// subject none of its streams holds is refused at Write, since
	// JetStream would refuse it for ever. Defaults to events.Full().
	Catalogue events.Catalogue
}

func (c *RelayConfig) setDefaults() {
	if len(c.Catalogue.Types) == 0 {
		c.Catalogue = events.Full()
	}
	if c.BatchSize == 0 {
		c.BatchSize = RelayBatchSizeDefault
	}
	if c.PollInterval == 0 {
		c.PollInterval = RelayPollIntervalDefault
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = RelayMaxAttemptsDefault
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = RelayBackoffMaxDefault
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = RelayAckTimeoutDefault
	}
	if c.Retention == 0 {
		c.Retention = RelayRetentionDefault
	}
	if c.LocalGrace == 0 {
		c.LocalGrace = RelayLocalGraceDefault
	}
	if c.VerifyInterval == 0 {
		c.VerifyInterval = RelayVerifyIntervalDefault
	}
	if c.VerifyBatch == 0 {
		c.VerifyBatch = RelayVerifyBatchDefault
	}
	if c.VerifyAgain == 0 {
		c.VerifyAgain = RelayVerifyAgainDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c *RelayConfig) validate() error {
	window, _ := events.StreamDuplicateWindow() // the streams' window, as this process creates them
	switch {
	case c.Pool == nil:
		return fmt.Errorf("%w: Pool is required", ErrInvalidConfig)
	case c.JetStream == nil:
		return fmt.Errorf("%w: JetStream is required", ErrInvalidConfig)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return fmt.Errorf("%w: BatchSize %d not in 1..10000", ErrInvalidConfig, c.BatchSize)
	case c.BackoffMax >= window/2:
		return fmt.Errorf("%w: BackoffMax %s must stay well inside the %s duplicate window", ErrInvalidConfig, c.BackoffMax, window)
	case c.VerifyBatch < 0:
		return fmt.Errorf("%w: VerifyBatch %d must not be negative", ErrInvalidConfig, c.VerifyBatch)
	case c.LocalGrace < 0 || c.LocalGrace >= window/2:
		return fmt.Errorf("%w: LocalGrace %s must stay well inside the %s duplicate window", ErrInvalidConfig, c.LocalGrace, window)
	}
	return nil
}

// Relay publishes a service's outbox to JetStream. Several relays may run
// on one schema at once: rows are claimed with FOR UPDATE SKIP LOCKED, so
// they may publish one trip's events out of order; consumers do not depend
// on order. Rows are claimed by status, never by an id watermark, so a row
// whose transaction commits late is published when it becomes visible.
type Relay struct {
	cfg     RelayConfig
	wake    chan struct{}
	channel string
	m       relayMetrics

	mu     sync.Mutex
	logged map[string]time.Time // last error log per cause

	// The local path: events handed over by Write after their commit.
	running atomic.Bool
	acks    chan localPending // published, waiting for the PubAck
	markMu  sync.Mutex
	toMark  dbsqlc.OutboxMarkPublishedByEventIDParams // acked events to mark published, with their PubAck's stream and sequence
	marked  chan struct{}
}

// startPublish starts the span of one event's publish (kind producer,
// "outbox publish <subject>") as a child of parent, the span context of the
// event's producer (see Write); a no-op span while tracing is off.
func startPublish(parent trace.SpanContext, id, subject, mode string) trace.Span {
	if !tracing.Enabled() {
		return noop.Span{}
	}
	_, span := tracing.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "outbox publish "+subject, trace.SpanKindProducer,
		attribute.String("messaging.system", "nats"), attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.destination.name", subject), attribute.String("messaging.message.id", id),
		attribute.String("tripsaga.relay.mode", mode), tracing.KeyTripID.String(fault.TripOfSubject(subject)))
	return span
}

type relayMetrics struct {
	published, quarantined prometheus.Counter
	// lost counts, by stream, published events the verify found lost;
	// verified the rows it checked.
	lost     *prometheus.CounterVec
	verified prometheus.Counter
	// failures counts failed publish attempts by Cause.
	failures *prometheus.CounterVec
}

// NewRelay returns a relay. It returns an error wrapping [ErrInvalidConfig]
// for a bad cfg.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, wake: make(chan struct{}, 1), logged: map[string]time.Time{},
		acks: make(chan localPending, 4096), marked: make(chan struct{}, 1)}
	r.m = relayMetrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "tripsaga_outbox_published_total", Help: "Outbox events published and acked by JetStream."}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tripsaga_outbox_publish_failures_total",
			Help: "Failed publish attempts of outbox events, by cause: refused (the event itself; counts towards quarantine) or an outage (storage, limits, no_stream, no_leader, timeout, disconnected, server; never quarantines).",
		}, []string{"cause"}),
		quarantined: prometheus.NewCounter(prometheus.CounterOpts{Name: "tripsaga_outbox_quarantined_total", Help: "Outbox events quarantined after MaxAttempts failures."}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tripsaga_outbox_lost_total",
			Help: "Published outbox events their stream no longer held (deleted, purged, restored from an older snapshot, not synced before a crash), found by the outbox verify and published again, by stream.",
		}, []string{"stream"}),
		verified: prometheus.NewCounter(prometheus.CounterOpts{Name: "tripsaga_outbox_verified_total", Help: "Published outbox rows the outbox verify checked against their stream."}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.m.published, r.m.failures, r.m.quarantined, r.m.lost, r.m.verified} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("outbox: metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Wake makes the relay look for rows now (in-process shortcut for NOTIFY).
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Running reports whether [Relay.Run] is running: its listener and its
// local publisher started, so an event written now with its after-commit
// publish (WithAfterCommit) is published by this relay at once.
func (r *Relay) Running() bool { return r.running.Load() }

// Run publishes until ctx ends. It listens for NOTIFY on
// "outbox_<schema>" and also polls every PollInterval.
func (r *Relay) Run(ctx context.Context) error {
	schema, err := queries.OutboxCurrentSchema(ctx, r.cfg.Pool)
	if err != nil {
		return fmt.Errorf("outbox: relay: %w", err)
	}
	r.channel = "outbox_" + schema
	go r.listen(ctx)
	var local sync.WaitGroup
	local.Add(2)
	go func() { defer local.Done(); r.awaitLocal(ctx) }()
	go func() { defer local.Done(); r.markLocal(ctx) }()
	if r.cfg.VerifyInterval > 0 {
		local.Go(func() { r.verifyLoop(ctx) })
	}
	r.running.Store(true)
	defer local.Wait()
	defer r.running.Store(false)
	t := time.NewTimer(r.cfg.PollInterval)
	defer t.Stop()
	clean := time.NewTicker(time.Hour)
	defer clean.Stop()
	for {
		wait := r.cfg.PollInterval
		for {
			n, err := r.PublishBatch(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				r.logBatchError(err)
				r.ensureStreams(ctx, err)
				if n == 0 {
					break
				}
			}
			if n == 0 && err == nil {
				// Idle: sleep until the soonest row is due, at most 10 ×
				// PollInterval (a NOTIFY lost on reconnect is caught then).
				if nd, err := queries.OutboxNextDue(ctx, r.cfg.Pool); err == nil {
					wait = min(max(time.Until(nd), time.Millisecond), 10*r.cfg.PollInterval)
				}
			}
			if n < r.cfg.BatchSize {
				break
			}
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-r.wake:
		case <-clean.C:
			n, err := queries.OutboxDeletePublishedBefore(ctx, r.cfg.Pool, time.Now().Add(-r.cfg.Retention))
			if err != nil {
				r.cfg.Logger.Warn("outbox cleanup failed", "err", err)
			} else if n > 0 {
				r.cfg.Logger.Info("outbox cleanup", "deleted", n)
			}
		}
	}
}

// logBatchError logs a failed batch at error level: an outage (the events
// wait, and are published when it ends) or a batch that failed as a whole.
// One line per cause per 10 s at most, so a long outage does not flood the
// log.
func (r *Relay) logBatchError(err error) {
	key := "batch"
	var oe *OutageError
	if errors.As(err, &oe) {
		key = string(oe.Cause)
	}
	r.mu.Lock()
	last := r.logged[key]
	now := time.Now()
	quiet := now.Sub(last) < 10*time.Second
	if !quiet {
		r.logged[key] = now
	}
	r.mu.Unlock()
	if quiet {
		return
	}
	if oe != nil {
		r.cfg.Logger.Error("outbox relay: JetStream cannot take events (outage); they wait and are retried with backoff, never quarantined", "err", err)
		return
	}
	r.cfg.Logger.Error("outbox relay batch failed; retrying", "err", err)
}

// ensureStreams calls RelayConfig.EnsureStreams after an outage for want
// of a stream, at most once per 10 s.
func (r *Relay) ensureStreams(ctx context.Context, err error) {
	var oe *OutageError
	if r.cfg.EnsureStreams == nil || !errors.As(err, &oe) {
		return
	}
	noStream := false
	for _, e := range unwrapJoin(err) {
		if errors.As(e, &oe) && oe.Cause == CauseNoStream {
			noStream = true
		}
	}
	if !noStream {
		return
	}
	r.mu.Lock()
	quiet := time.Since(r.logged["ensure"]) < 10*time.Second
	if !quiet {
		r.logged["ensure"] = time.Now()
	}
	r.mu.Unlock()
	if quiet {
		return
	}
	if err := r.cfg.EnsureStreams(ctx); err != nil {
		r.cfg.Logger.Error("outbox relay: cannot create the streams again", "err", err)
		return
	}
	r.cfg.Logger.Warn("outbox relay: events found no stream; the service's streams were created again")
}

// unwrapJoin returns the errors joined in err (errors.Join), or err.
func unwrapJoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// service names the relay's service in fault points: its schema.
func (r *Relay) service() string { return strings.TrimPrefix(r.channel, "outbox_") }
