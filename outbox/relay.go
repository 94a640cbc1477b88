package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
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

	// beforeMark, in tests, runs after publishing and before marking rows;
	// an error aborts the transaction as a crash there would.
	beforeMark func() error
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

// localEvent is an event Write stored, handed to the writer's relay.
type localEvent struct {
	id, subject string
	headers     map[string]string
	data        []byte
	// trace is the span context of the Write that stored it (invalid when
	// tracing is off).
	trace trace.SpanContext
}

type localPending struct {
	id, subject string
	f           jetstream.PubAckFuture
	span        trace.Span // the publish span, ended at the PubAck
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

// parentOfHeaders is the span context of an outbox row's event: its
// ce-traceparent and ce-tracestate headers.
func parentOfHeaders(h map[string]string) trace.SpanContext {
	tp, ts := events.TraceContextOfHeaders(h)
	if tp == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(tracing.WithParent(context.Background(), tp, ts))
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

// relayMarkGather is how long acked local events gather before one
// statement marks them.
const relayMarkGather = 20 * time.Millisecond

// relayBackoffMin is a failed row's first backoff; it doubles per failure
// up to RelayConfig.BackoffMax.
const relayBackoffMin = 100 * time.Millisecond

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

func (r *Relay) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Warn("outbox relay LISTEN lost; polling meanwhile", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	conn, err := r.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(r.channel)); err != nil {
		return err
	}
	defer func() {
		// Leave the pooled connection clean.
		_, _ = conn.Exec(context.Background(), "UNLISTEN *")
	}()
	r.Wake() // rows written while we were not listening
	for {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			return err
		}
		r.Wake()
	}
}

// service names the relay's service in fault points: its schema.
func (r *Relay) service() string { return strings.TrimPrefix(r.channel, "outbox_") }

func quoteIdent(s string) string {
	out := []byte{'"'}
	for i := 0; i < len(s); i++ {
		if s[i] == '"' {
			out = append(out, '"')
		}
		out = append(out, s[i])
	}
	return string(append(out, '"'))
}

// errNoPubAck is a publish whose PubAck did not come before AckTimeout.
var errNoPubAck = errors.New("outbox: no PubAck before AckTimeout")

// PublishBatch claims up to BatchSize due rows in one transaction,
// publishes them asynchronously, waits for their PubAcks (at most
// AckTimeout) and, in that transaction, marks every acked row published
// with one statement (a duplicate PubAck is success), whatever happened to
// the others. A row the server refused for what it is ([CauseRefused])
// gets a backoff and is quarantined after MaxAttempts refusals; a row that
// failed for the server's state (an outage: storage, limits, no stream, no
// leader, timeout, no connection) gets a backoff and is never counted
// towards quarantine. It returns how many rows it claimed, and an error
// naming the causes when rows failed for an outage (rows were still marked)
// or when the batch itself failed (nothing marked; the next batch
// re-publishes and the duplicate window drops what got through).
func (r *Relay) PublishBatch(ctx context.Context) (int, error) {
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := queries.OutboxClaimBatch(ctx, tx, int32(r.cfg.BatchSize))
	if err != nil {
		return 0, fmt.Errorf("claim: %w", err)
	}
	if len(rows) == 0 {
		return 0, nil
	}
	type pending struct {
		row  dbsqlc.OutboxClaimBatchRow
		f    jetstream.PubAckFuture
		ack  *jetstream.PubAck
		err  error
		span trace.Span
	}
	ps := make([]pending, len(rows))
	for i, row := range rows {
		ps[i].row = row
		var h map[string]string
		if err := json.Unmarshal(row.Headers, &h); err != nil {
			ps[i].err = fmt.Errorf("%w: headers: %w", errBadRow, err)
			continue
		}
		msg := &nats.Msg{Subject: row.NatsSubject, Data: row.Data, Header: nats.Header{}}
		for k, v := range h {
			msg.Header[k] = []string{v}
		}
		if tracing.Enabled() {
			ps[i].span = startPublish(parentOfHeaders(h), row.EventID, row.NatsSubject, "batch")
		}
		ps[i].f, ps[i].err = r.cfg.JetStream.PublishMsgAsync(msg, jetstream.WithMsgID(row.EventID))
	}
	if tracing.Enabled() {
		defer func() {
			for i := range ps {
				if ps[i].span != nil {
					tracing.End(ps[i].span, ps[i].err)
				}
			}
		}()
	}
	deadline := time.NewTimer(r.cfg.AckTimeout)
	defer deadline.Stop()
	expired := false
	for i := range ps {
		p := &ps[i]
		if p.err != nil {
			continue
		}
		if !expired {
			select {
			case p.ack = <-p.f.Ok():
				continue
			case err := <-p.f.Err():
				p.err = err
				continue
			case <-deadline.C:
				expired = true
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		// Past the deadline: take what has arrived, the rest timed out.
		select {
		case p.ack = <-p.f.Ok():
		case err := <-p.f.Err():
			p.err = err
		default:
			p.err = errNoPubAck
		}
	}
	var ok dbsqlc.OutboxMarkPublishedParams
	var outage dbsqlc.OutboxMarkOutageParams
	outages := map[Cause]int{}
	var refused []*pending
	for i := range ps {
		p := &ps[i]
		if p.err == nil {
			ok.Ids = append(ok.Ids, p.row.ID)
			ok.Streams = append(ok.Streams, p.ack.Stream)
			ok.Seqs = append(ok.Seqs, int64(p.ack.Sequence))
			continue
		}
		c := Classify(p.err)
		r.m.failures.WithLabelValues(string(c)).Inc()
		if !c.Outage() {
			refused = append(refused, p)
			continue
		}
		outages[c]++
		outage.Ids = append(outage.Ids, p.row.ID)
		outage.Causes = append(outage.Causes, string(c))
		outage.Errors = append(outage.Errors, p.err.Error())
	}
	if r.cfg.beforeMark != nil {
		if err := r.cfg.beforeMark(); err != nil {
			return 0, err
		}
	}
	if err := fault.HitAny(ctx, fault.At(r.service(), "relay", fault.AfterPublish), len(ps), func(i int) string { return fault.TripOfSubject(ps[i].row.NatsSubject) }); err != nil {
		return 0, err
	}
	if len(ok.Ids) > 0 {
		if err := queries.OutboxMarkPublished(ctx, tx, ok); err != nil {
			return 0, fmt.Errorf("mark published: %w", err)
		}
	}
	if len(outage.Ids) > 0 {
		outage.BackoffMinSeconds = relayBackoffMin.Seconds()
		outage.BackoffMaxSeconds = r.cfg.BackoffMax.Seconds()
		if err := queries.OutboxMarkOutage(ctx, tx, outage); err != nil {
			return 0, fmt.Errorf("mark outage: %w", err)
		}
	}
	quarantined := 0
	for _, p := range refused {
		backoff := math.Min(relayBackoffMin.Seconds()*math.Pow(2, float64(p.row.Attempts)), r.cfg.BackoffMax.Seconds())
		q, err := queries.OutboxMarkRefused(ctx, tx, dbsqlc.OutboxMarkRefusedParams{
			ID: p.row.ID, LastError: new(p.err.Error()), BackoffSeconds: backoff, MaxAttempts: int32(r.cfg.MaxAttempts),
		})
		if err != nil {
			return 0, fmt.Errorf("mark refused: %w", err)
		}
		if q {
			quarantined++
			r.cfg.Logger.Error("outbox event quarantined: the server refused it MaxAttempts times; re-drive it with `tripsaga outbox redrive` once the cause is fixed",
				"event_id", p.row.EventID, "subject", p.row.NatsSubject, "attempts", p.row.Attempts+1, "err", p.err)
		} else {
			r.cfg.Logger.Warn("outbox event refused by the server; will retry", "event_id", p.row.EventID, "subject", p.row.NatsSubject, "attempt", p.row.Attempts+1, "err", p.err, "backoff_s", backoff)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// A failed COMMIT may have committed: rows are re-read next time and
		// a re-publish is dropped by the duplicate window.
		return 0, fmt.Errorf("commit: %w", err)
	}
	r.m.published.Add(float64(len(ok.Ids)))
	r.m.quarantined.Add(float64(quarantined))
	if len(outages) > 0 {
		var errs []error
		for _, c := range slices.Sorted(maps.Keys(outages)) {
			for _, p := range ps {
				if p.err != nil && Classify(p.err) == c {
					errs = append(errs, &OutageError{Cause: c, Events: outages[c], Err: p.err})
					break
				}
			}
		}
		return len(rows), errors.Join(errs...)
	}
	return len(rows), nil
}

// OutageError is returned by [Relay.PublishBatch] when Events rows of the
// batch could not be published for an outage of cause Cause (Err is the
// first such row's error). Those rows wait with a backoff; the others of
// the batch were handled.
type OutageError struct {
	Cause  Cause
	Events int
	Err    error
}

func (e *OutageError) Error() string {
	return fmt.Sprintf("outbox: %d events not published (outage: %s): %v", e.Events, e.Cause, e.Err)
}

func (e *OutageError) Unwrap() error { return e.Err }

// publishLocal publishes events stored by a transaction that has just
// committed, without claiming their rows; awaitLocal takes their PubAcks
// and markLocal marks them. An event that fails here is left to the claims
// of every relay once RelayConfig.LocalGrace has passed.
func (r *Relay) publishLocal(evs []localEvent) {
	for _, e := range evs {
		msg := &nats.Msg{Subject: e.subject, Data: e.data, Header: make(nats.Header, len(e.headers)+1)}
		for k, v := range e.headers {
			msg.Header[k] = []string{v}
		}
		var span trace.Span = noop.Span{}
		if e.trace.IsValid() {
			span = startPublish(e.trace, e.id, e.subject, "local")
		}
		f, err := r.cfg.JetStream.PublishMsgAsync(msg, jetstream.WithMsgID(e.id))
		if err != nil {
			r.m.failures.WithLabelValues(string(Classify(err))).Inc()
			r.cfg.Logger.Debug("outbox: local publish failed; the relay's claim publishes it later", "event_id", e.id, "err", err)
			tracing.End(span, err)
			continue
		}
		select {
		case r.acks <- localPending{id: e.id, subject: e.subject, f: f, span: span}:
		default:
			// Too many waiting for PubAcks: the claims publish it later.
			span.End()
		}
	}
}

func (r *Relay) awaitLocal(ctx context.Context) {
	timer := time.NewTimer(r.cfg.AckTimeout)
	defer timer.Stop()
	for {
		var p localPending
		select {
		case <-ctx.Done():
			return
		case p = <-r.acks:
		}
		timer.Reset(r.cfg.AckTimeout)
		select {
		case <-ctx.Done():
			p.span.End()
			return
		case ack := <-p.f.Ok():
			p.span.End()
			if fault.Hit(ctx, fault.At(r.service(), "relay", fault.AfterPublish), fault.TripOfSubject(p.subject)) != nil {
				continue // as if the mark failed: claimed after LocalGrace, re-published, deduplicated
			}
			r.markMu.Lock()
			r.toMark.EventIds = append(r.toMark.EventIds, p.id)
			r.toMark.Streams = append(r.toMark.Streams, ack.Stream)
			r.toMark.Seqs = append(r.toMark.Seqs, int64(ack.Sequence))
			r.markMu.Unlock()
			select {
			case r.marked <- struct{}{}:
			default:
			}
		case err := <-p.f.Err():
			r.m.failures.WithLabelValues(string(Classify(err))).Inc()
			r.cfg.Logger.Debug("outbox: local publish failed; the relay's claim publishes it later", "event_id", p.id, "err", err)
			tracing.End(p.span, err)
		case <-timer.C:
			r.m.failures.WithLabelValues(string(CauseTimeout)).Inc()
			tracing.End(p.span, errNoPubAck)
		}
	}
}

// markLocal marks acked events published, all that have gathered in one
// statement, one statement at a time: under load one UPDATE marks many.
func (r *Relay) markLocal(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.marked:
		}
		// Let acks gather: under load one statement marks many rows.
		select {
		case <-ctx.Done():
			return
		case <-time.After(relayMarkGather):
		}
		r.markMu.Lock()
		ids := r.toMark
		r.toMark = dbsqlc.OutboxMarkPublishedByEventIDParams{}
		r.markMu.Unlock()
		if len(ids.EventIds) == 0 {
			continue
		}
		if err := queries.OutboxMarkPublishedByEventID(ctx, r.cfg.Pool, ids); err != nil {
			// Left unmarked, the rows are claimed after LocalGrace and
			// re-published; the duplicate window drops the copies.
			if ctx.Err() == nil {
				r.cfg.Logger.Warn("outbox: cannot mark published events; they will be re-published and deduplicated", "events", len(ids.EventIds), "err", err)
			}
			continue
		}
		r.m.published.Add(float64(len(ids.EventIds)))
	}
}
