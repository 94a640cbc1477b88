package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/internal/tracing"
	"github.com/tripsaga/tripsaga/outbox/internal/dbsqlc"
)

// Inbox defaults.
const (
	InboxMaxDeliverDefault  = 25
	InboxAckWaitDefault     = 5 * time.Second
	InboxConcurrencyDefault = 4
	InboxBackoffMaxDefault  = 15 * time.Second
)

// Headers added to a parked (dead-lettered) message, beside the original
// headers and body.
const (
	HeaderDeadReason   = "Tripsaga-Dead-Reason"
	HeaderDeadStream   = "Tripsaga-Dead-Stream"
	HeaderDeadSeq      = "Tripsaga-Dead-Seq"
	HeaderDeadSubject  = "Tripsaga-Dead-Subject"
	HeaderDeadConsumer = "Tripsaga-Dead-Consumer"
)

// ErrPermanent marks a handler error that no retry can cure (a payload the
// handler cannot use): the event is parked at once. Wrap it:
// fmt.Errorf("%w: no trip id", outbox.ErrPermanent). Errors wrapping
// events.ErrInvalidEvent or events.ErrUnknownType are treated the same.
var ErrPermanent = errors.New("outbox: permanent handler error")

// HandlerFunc handles one event inside tx, the transaction that also
// records the event in the inbox. Return nil to commit and ack; an error
// rolls back and the event is redelivered with backoff (or parked when it
// wraps [ErrPermanent], or after MaxDeliver deliveries).
type HandlerFunc func(ctx context.Context, tx pgx.Tx, e event.Event) error

// Delivery is one decoded event an inbox received, with its place in its
// stream.
type Delivery struct {
	Event  event.Event
	Stream string
	Seq    uint64
	// span is the event's consume span (a child of its producer's), nil
	// while tracing is off.
	span trace.Span
}

// Context returns ctx with the delivery's consume span, for the work done
// for its event in a batch (events written then carry that span's trace
// context); ctx while tracing is off.
func (d Delivery) Context(ctx context.Context) context.Context {
	if d.span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, d.span)
}

// BatchFunc applies deliveries of one stream inside tx; see
// InboxConfig.BatchApply.
type BatchFunc func(ctx context.Context, tx pgx.Tx, consumer string, ds []Delivery) error

// InboxConfig configures an [Inbox].
type InboxConfig struct {
	// Name is the durable consumer name and the inbox's dedup scope.
	// Required.
	Name string
	// Stream to consume. Required.
	Stream string
	// FilterSubjects select the events (e.g. "hotel.held.>"). Required.
	FilterSubjects []string
	// Types are the event types the handler accepts; any other type is
	// parked as unknown. Required.
	Types []string
	// Pool reaches the service's schema. Required.
	Pool *pgxpool.Pool
	// JetStream consumes and parks. Required.
	JetStream jetstream.JetStream
	// Handler does the work. Required.
	Handler HandlerFunc
	// OnCommitted, if set, runs after a handled event's transaction
	// commits (e.g. to wake a step runner).
	OnCommitted func(e event.Event)
	// Relay, when set, is the process's relay: events the handler writes
	// (Write) are published by it right after the commit, and functions
	// registered with AfterCommit run then (see WithAfterCommit).
	Relay *Relay
	// MaxDeliver: at this delivery a still-failing event is parked, if
	// PostgreSQL answers (the failure is the handler's, not an outage's).
	// Defaults to 25. The consumer itself is created with MaxDeliver -1,
	// set explicitly (NATS docs), so the server never drops an event.
	MaxDeliver int
	// AckWait is the server's redelivery timer: a message handed to a
	// client that died comes back after it (nats-server #4627). Handlers
	// only touch PostgreSQL (company calls run from the step log), so it can
	// be short. Defaults to 5 s.
	AckWait time.Duration
	// Concurrency is how many events are handled at once. Defaults to 4.
	Concurrency int
	// BatchApply, when set, applies many events in one transaction: each
	// worker takes the events that have arrived (at most BatchSize) and
	// calls BatchApply once, which must record each event in the inbox
	// itself in tx (dedup by (consumer, source, id)) with its effect. If
	// it fails, the batch is rolled back and each event is handled alone by
	// Handler, so one bad event only fails itself. Events that cannot be
	// decoded or are of a type not in Types never reach it (parked).
	BatchApply BatchFunc
	// BatchSize caps a BatchApply batch. Defaults to 256.
	BatchSize int
	// BatchLock, when set, is held while a batch is applied: inboxes that
	// share it (one per stream of one projection) apply one batch at a time
	// instead of waiting on each other's row locks in PostgreSQL.
	BatchLock sync.Locker
	// BackoffMax caps the redelivery delay after a handler error
	// (200 ms doubling). Defaults to 15 s.
	BackoffMax time.Duration
	// Logger defaults to a discard logger.
	Logger *slog.Logger
	// Metrics, when set, counts handled, duplicate, retried and parked
	// events, and consumers found lost.
	Metrics *InboxMetrics
	// WatchInterval is how often the inbox reads its consumer's info: to
	// notice that the consumer was deleted or replaced (see [Inbox.Run])
	// and to record its ack floor in inbox_position. Defaults to 2 s.
	WatchInterval time.Duration
	// Optional inboxes never fail readiness ([Readiness]): what their
	// Check says is a line of /readyz, not a 503. The inbox of the
	// operators' actions is one: the OPERATOR stream only feeds it, and
	// bookings do not need it.
	Optional bool
}

// InboxMetrics are shared by all inboxes of a process.
type InboxMetrics struct {
	events *prometheus.CounterVec
	lost   *prometheus.CounterVec
}

// Reasons an inbox gives for a lost consumer, the reason label of
// tripsaga_inbox_consumer_lost_total.
const (
	// LostDeleted: the server told a waiting pull request that the
	// consumer was deleted (409 Consumer Deleted, jetstream.ErrConsumerDeleted).
	LostDeleted = "deleted"
	// LostMissing: the consumer's info answered consumer not found
	// (jetstream.ErrConsumerNotFound), e.g. it was deleted while no pull
	// request was waiting, or the stream was restored without it.
	LostMissing = "missing"
	// LostReplaced: a consumer of that name exists but was created after
	// ours (another creation time): someone deleted and recreated it.
	LostReplaced = "replaced"
	// LostReset: the consumer's ack floor went back (a reset, or a stream
	// restored under it): events after it come again, which the inbox
	// drops as duplicates.
	LostReset = "reset"
	// LostStopped: the client stopped consuming by itself (a bad request
	// answer, the connection closed).
	LostStopped = "stopped"
	// LostStreamReplaced: the stream is not the one the inbox's position
	// counts on: it was deleted and made again (another creation time), or
	// restored from an older store (its last sequence went back). The
	// consumer reads the new stream from its first message; the inbox table
	// drops the events it handled already.
	LostStreamReplaced = "stream_replaced"
)

// NewInboxMetrics registers the inbox counters on reg:
// tripsaga_inbox_events_total{consumer,outcome} and
// tripsaga_inbox_consumer_lost_total{consumer,stream,reason}.
func NewInboxMetrics(reg prometheus.Registerer) (*InboxMetrics, error) {
	m := &InboxMetrics{events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tripsaga_inbox_events_total",
		Help: "Events seen by inbox consumers, by outcome (handled, duplicate, retried, parked).",
	}, []string{"consumer", "outcome"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tripsaga_inbox_consumer_lost_total",
			Help: "Durable consumers an inbox found deleted, missing, replaced, reset or stopped, and recreated or took up again.",
		}, []string{"consumer", "stream", "reason"})}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.events, m.lost} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("inbox metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *InboxMetrics) incLost(consumer, stream, reason string) {
	if m != nil {
		m.lost.WithLabelValues(consumer, stream, reason).Inc()
	}
}

func (m *InboxMetrics) inc(consumer, outcome string) {
	if m != nil {
		m.events.WithLabelValues(consumer, outcome).Inc()
	}
}

func (c *InboxConfig) setDefaults() {
	if c.MaxDeliver == 0 {
		c.MaxDeliver = InboxMaxDeliverDefault
	}
	if c.AckWait == 0 {
		c.AckWait = InboxAckWaitDefault
	}
	if c.Concurrency == 0 {
		c.Concurrency = InboxConcurrencyDefault
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = InboxBackoffMaxDefault
	}
	if c.BatchSize == 0 {
		c.BatchSize = 256
	}
	if c.WatchInterval == 0 {
		c.WatchInterval = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c *InboxConfig) validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("%w: Name is required", ErrInvalidConfig)
	case c.Stream == "":
		return fmt.Errorf("%w: Stream is required", ErrInvalidConfig)
	case len(c.FilterSubjects) == 0:
		return fmt.Errorf("%w: FilterSubjects is required", ErrInvalidConfig)
	case len(c.Types) == 0:
		return fmt.Errorf("%w: Types is required", ErrInvalidConfig)
	case c.Pool == nil || c.JetStream == nil || c.Handler == nil:
		return fmt.Errorf("%w: Pool, JetStream and Handler are required", ErrInvalidConfig)
	case c.MaxDeliver < 2:
		return fmt.Errorf("%w: MaxDeliver %d < 2", ErrInvalidConfig, c.MaxDeliver)
	}
	return nil
}

// Inbox is a durable JetStream pull consumer with explicit acks whose
// handler runs in a transaction that also records the event id. Delivery is
// at-least-once; the inbox makes the effect exactly-once. Events are
// handled concurrently and in no guaranteed order.
type Inbox struct {
	cfg   InboxConfig
	types map[string]bool
	cons  atomic.Pointer[jetstream.Consumer]
	// lastSeen is when a message last arrived (unix ns).
	lastSeen atomic.Int64
	// created is the creation time (unix ns) of the consumer consumed.
	created atomic.Int64
	// floor is the consumer's ack floor (stream sequence) last seen;
	// stored tells whether inbox_position holds it.
	floor  atomic.Uint64
	stored atomic.Bool
	// streamCreated is the creation time (unix µs, PostgreSQL's precision)
	// of the stream that floor counts on, and lastSeq the highest last
	// sequence seen on it: a stream with another creation time, or whose
	// last sequence is below lastSeq, is another stream.
	streamCreated atomic.Int64
	lastSeq       atomic.Uint64
	// noticed: the watch reported LostStreamReplaced (and Run counted it),
	// so ensure does not count that stream a second time.
	noticed atomic.Bool
}

// ErrStalled is returned by [Inbox.Check] when the consumer has messages
// waiting but none arrived for a while: a pull consumer can stall silently
// after a reconnect or leader change (nats.go #1729).
var ErrStalled = errors.New("outbox: inbox consumer stalled")

// ErrStreamMissing is returned by [Inbox.Check] when the inbox's stream
// does not exist: not created yet by the service that owns it (each
// service's NATS identity may create only its own, internal/natsauth), or
// deleted. [Inbox.Run] waits for it and consumes once it appears.
var ErrStreamMissing = errors.New("outbox: the inbox's stream does not exist")

// CheckAll runs [Readiness] on the inboxes and returns its error: the
// first inbox that fails readiness.
func CheckAll(ctx context.Context, inboxes ...*Inbox) error {
	_, err := Readiness(ctx, inboxes...)
	return err
}

// InboxWait is an inbox that is not consuming, or not well, without
// failing readiness: its stream does not exist (yet), or it is
// [InboxConfig.Optional].
type InboxWait struct {
	Consumer string // the durable consumer's name (InboxConfig.Name)
	Stream   string
	// Err is what [Inbox.Check] said; it wraps [ErrStreamMissing] when
	// the stream does not exist.
	Err error
}

// Readiness checks the inboxes for a readiness endpoint
// (docs/contracts/trips-api.md, /readyz). err is the first error of an
// inbox that is not Optional and whose stream exists: stalled
// ([ErrStalled]), its consumer's info unreadable, or its consumer not
// created yet or lost and being recreated. An inbox whose stream does not
// exist, and any trouble of an Optional inbox, never fail readiness: they
// are in waits, one each, in the order given, so that processes may start
// in any order and a lost stream another service owns makes no process
// unready while it is gone.
func Readiness(ctx context.Context, inboxes ...*Inbox) (waits []InboxWait, err error) {
	for _, in := range inboxes {
		cerr := in.Check(ctx)
		switch {
		case cerr == nil:
		case in.cfg.Optional || errors.Is(cerr, ErrStreamMissing):
			waits = append(waits, InboxWait{Consumer: in.cfg.Name, Stream: in.cfg.Stream, Err: cerr})
		case err == nil:
			err = cerr
		}
	}
	return waits, err
}

// Check reports whether the consumer makes progress: it returns an error
// wrapping [ErrStalled] when the server holds undelivered messages for it
// and none arrived during the last 2×AckWait (at least 10 s), one wrapping
// [ErrStreamMissing] when its stream does not exist, or another error
// when the consumer's info cannot be read or the consumer is not created
// yet. Use it in a readiness check, through [Readiness].
func (in *Inbox) Check(ctx context.Context) error {
	cp := in.cons.Load()
	if cp == nil {
		if err := in.streamMissing(ctx); err != nil {
			return err
		}
		return fmt.Errorf("inbox %s: consumer on %s not created yet, or lost and being recreated", in.cfg.Name, in.cfg.Stream)
	}
	info, err := (*cp).Info(ctx)
	if err != nil {
		// A deleted stream takes its consumers with it: the consumer's
		// info then answers stream not found (10059), or consumer not
		// found once the stream is back without it.
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			if merr := in.streamMissing(ctx); merr != nil {
				return merr
			}
		}
		return fmt.Errorf("inbox %s: %w", in.cfg.Name, err)
	}
	quiet := time.Since(time.Unix(0, in.lastSeen.Load()))
	if info.NumPending > 0 && quiet > max(2*in.cfg.AckWait, 10*time.Second) {
		return fmt.Errorf("%w: %s on %s has %d waiting, nothing arrived for %s", ErrStalled, in.cfg.Name, in.cfg.Stream, info.NumPending, quiet.Round(time.Second))
	}
	return nil
}

// streamMissing returns an error wrapping [ErrStreamMissing] when the
// inbox's stream does not exist, and nil otherwise (it exists, or its info
// could not be read: no verdict).
func (in *Inbox) streamMissing(ctx context.Context) error {
	_, err := in.cfg.JetStream.Stream(ctx, in.cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: %s (inbox %s consumes it once it appears)", ErrStreamMissing, in.cfg.Stream, in.cfg.Name)
	}
	return nil
}

// NewInbox returns an inbox; it returns an error wrapping
// [ErrInvalidConfig] for a bad cfg.
func NewInbox(cfg InboxConfig) (*Inbox, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	in := &Inbox{cfg: cfg, types: map[string]bool{}}
	for _, t := range cfg.Types {
		in.types[t] = true
	}
	return in, nil
}

// Run creates or updates the durable consumer and handles events until ctx
// ends; it returns an error only when the consumer cannot be set up at
// start or the NATS connection is closed for good.
//
// A consumer that disappears while Run runs is noticed and recreated:
// the server answers a waiting pull request with 409 Consumer Deleted
// (jetstream.ErrConsumerDeleted, after which nats.go stops consuming), and
// every WatchInterval Run reads the consumer's info, which answers
// jetstream.ErrConsumerNotFound once it is gone, or shows another creation
// time once someone replaced it, or an ack floor that went back (a reset).
// Missed heartbeats and no-responders answers trigger that read at once.
// Each is logged at error level and counted
// (tripsaga_inbox_consumer_lost_total), and the consumer is recreated from
// the inbox's position (see [Inbox.StartSeq]) or, if it exists again,
// taken up as it is unless it would skip events after that position.
// JetStream cannot move a durable consumer's start once created (nats.go
// ConsumerConfig: DeliverPolicy and OptStartSeq cannot be updated), so a
// start is only ever chosen when the consumer is created.
func (in *Inbox) Run(ctx context.Context) error {
	cons, err := in.ensure(ctx)
	// A stream is created by the service that owns it (its NATS identity
	// may create no other), or by `tripsaga streams apply`: one that does
	// not exist yet is waited for, asking every StreamWaitMax at most, so
	// processes may start in any order. Meanwhile Check says so
	// (ErrStreamMissing), which fails no readiness (see Readiness).
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		in.cfg.Logger.Warn("inbox: the stream does not exist yet (its service creates it at start, or tripsaga streams apply); consuming once it appears",
			"consumer", in.cfg.Name, "stream", in.cfg.Stream)
		// While it waits (for as long as the stream's service is not run:
		// the INSURANCE stream of a system without insurance, say), a
		// failure to reach PostgreSQL or NATS is one more reason to ask
		// again, never one to end the process.
		for delay := 200 * time.Millisecond; err != nil; delay = min(2*delay, StreamWaitMax) {
			if !errors.Is(err, jetstream.ErrStreamNotFound) {
				in.cfg.Logger.Warn("inbox: waiting for the stream: cannot ask now; asking again", "consumer", in.cfg.Name, "stream", in.cfg.Stream, "err", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
			cons, err = in.ensure(ctx)
		}
		if err == nil {
			in.cfg.Logger.Info("inbox: the stream appeared; consuming", "consumer", in.cfg.Name, "stream", in.cfg.Stream)
		}
	}
	if err != nil {
		return err
	}
	prefetch := in.prefetch()
	work := make(chan jetstream.Msg, prefetch)
	var wg sync.WaitGroup
	for range in.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in.work(ctx, work)
		}()
	}
	defer func() {
		close(work)
		wg.Wait()
	}()
	log := in.cfg.Logger.With("consumer", in.cfg.Name, "stream", in.cfg.Stream)
	for {
		reason, detail := in.consume(ctx, cons, work)
		if ctx.Err() != nil {
			return nil
		}
		in.cons.Store(nil)
		in.cfg.Metrics.incLost(in.cfg.Name, in.cfg.Stream, reason)
		log.Error("inbox: durable consumer lost; recreating it from the inbox's position", "reason", reason, "detail", detail)
		if nc := in.cfg.JetStream.Conn(); nc != nil && nc.IsClosed() {
			return fmt.Errorf("inbox %s: consumer on %s lost (%s) and the NATS connection is closed: %w", in.cfg.Name, in.cfg.Stream, reason, nats.ErrConnectionClosed)
		}
		// A consumer deleted on the server is cleaned up asynchronously:
		// creating one of the same name at once can lose its folder.
		sleepCtx(ctx, consumerCleanupWait)
		delay := 200 * time.Millisecond
		for {
			cons, err = in.ensure(ctx)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			log.Error("inbox: cannot recreate the durable consumer; retrying", "err", err, "delay", delay)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
			delay = min(2*delay, 5*time.Second)
		}
		ci := cons.CachedInfo()
		log.Warn("inbox: consuming again", "deliver_policy", ci.Config.DeliverPolicy.String(), "start_seq", ci.Config.OptStartSeq, "ack_floor", ci.AckFloor.Stream)
	}
}

// StreamWaitMax is the longest an inbox whose stream does not exist yet
// waits between two looks for it (200 ms doubling): a stream that appears
// is consumed within it.
const StreamWaitMax = 2 * time.Second

// consumerConfig is the durable consumer's configuration, delivering all.
func (in *Inbox) consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        in.cfg.Name,
		FilterSubjects: in.cfg.FilterSubjects,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        in.cfg.AckWait,
		// Unlimited on the server: the inbox itself parks an event after
		// MaxDeliver deliveries, but only when PostgreSQL answers, so an
		// outage never parks (and so never loses) a good event.
		MaxDeliver:    -1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: 1000,
	}
}

// ensure returns the durable consumer, ready to consume. It first checks
// that the stream is the one the inbox's position counts on (see
// [Inbox.checkStream]; on another stream the position is 0). Then an
// existing consumer is updated keeping its start (which the server does
// not let change), unless that start would skip events after the
// position, in which case it is deleted; a missing one is created from one
// past the position (all of the stream when it is 0).
//
// All of it runs while this consumer's inbox_position row is locked in
// PostgreSQL: the replicas of a service share the consumer, and one that
// finds the stream replaced must not have its new consumer deleted, or an
// old position recorded over its decision, by another doing the same at
// once. The second to come sees the stream recorded and takes up the
// consumer the first made.
func (in *Inbox) ensure(ctx context.Context) (jetstream.Consumer, error) {
	tx, err := in.cfg.Pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("inbox %s: consumer on %s: %w", in.cfg.Name, in.cfg.Stream, err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	pos, st, why, err := in.checkStream(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("inbox %s: consumer on %s: %w", in.cfg.Name, in.cfg.Stream, err)
	}
	if why != "" {
		// What this process saw counts on the old stream.
		in.floor.Store(0)
		in.lastSeq.Store(0)
	}
	cons, err := in.ensureConsumer(ctx, pos)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		// Not recorded: the next ensure finds the stream new again and
		// takes up the consumer made from its start, or makes it again.
		return nil, fmt.Errorf("inbox %s: consumer on %s: record the stream: %w", in.cfg.Name, in.cfg.Stream, err)
	}
	in.streamCreated.Store(st.Created.Truncate(time.Microsecond).UnixMicro())
	in.lastSeq.Store(st.State.LastSeq)
	// Counted once per new stream in this process: by Run when the watch
	// noticed it, here when ensure did.
	if noticed := in.noticed.Swap(false); why != "" {
		if !noticed {
			in.cfg.Metrics.incLost(in.cfg.Name, in.cfg.Stream, LostStreamReplaced)
		}
		in.cfg.Logger.Error("inbox: the stream is not the one the inbox's position counts on; reading it from its first message (the inbox drops what it handled already)",
			"consumer", in.cfg.Name, "stream", in.cfg.Stream, "reason", LostStreamReplaced, "detail", why,
			"first_seq", st.State.FirstSeq, "last_seq", st.State.LastSeq)
	}
	return cons, nil
}

// ensureConsumer is ensure's part on the server, pos the inbox's position
// on the stream as it is now.
func (in *Inbox) ensureConsumer(ctx context.Context, pos uint64) (jetstream.Consumer, error) {
	js, stream, name := in.cfg.JetStream, in.cfg.Stream, in.cfg.Name
	var lastErr error
	for range 3 {
		cfg := in.consumerConfig()
		cur, err := js.Consumer(ctx, stream, name)
		switch {
		case err == nil:
			ci := cur.CachedInfo().Config
			if skips(ci, pos) {
				in.cfg.Logger.Error("inbox: durable consumer starts after the inbox's position; deleting it to recreate it",
					"consumer", name, "stream", stream, "deliver_policy", ci.DeliverPolicy.String(), "start_seq", ci.OptStartSeq, "position", pos)
				if err := js.DeleteConsumer(ctx, stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
					return nil, fmt.Errorf("inbox %s: delete consumer on %s: %w", name, stream, err)
				}
				continue
			}
			cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = ci.DeliverPolicy, ci.OptStartSeq, ci.OptStartTime
			cons, err := js.CreateOrUpdateConsumer(ctx, stream, cfg)
			if serverFailure(err) {
				// The server could not write the consumer's store: seen
				// when a consumer deleted and created again at once lost
				// its folder to the delete's cleanup, after which every
				// update fails. Delete it, let the cleanup finish, and
				// create it from the inbox's position.
				in.cfg.Logger.Error("inbox: the server cannot update the durable consumer; deleting it to recreate it", "consumer", name, "stream", stream, "err", err)
				if derr := js.DeleteConsumer(ctx, stream, name); derr != nil && !errors.Is(derr, jetstream.ErrConsumerNotFound) {
					return nil, fmt.Errorf("inbox %s: delete consumer on %s: %w", name, stream, derr)
				}
				lastErr = err
				sleepCtx(ctx, consumerCleanupWait)
				continue
			}
			if err != nil {
				lastErr = err
				continue // deleted or replaced meanwhile
			}
			in.adopt(cons)
			return cons, nil
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			if start := pos + 1; start > 1 {
				cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
			}
			cons, err := js.CreateConsumer(ctx, stream, cfg)
			if serverFailure(err) {
				lastErr = err
				sleepCtx(ctx, consumerCleanupWait) // a delete's cleanup may still run
				continue
			}
			if err != nil {
				lastErr = err
				continue // created meanwhile (another process of the service)
			}
			in.adopt(cons)
			return cons, nil
		default:
			return nil, fmt.Errorf("inbox %s: consumer on %s: %w", name, stream, err)
		}
	}
	return nil, fmt.Errorf("inbox %s: consumer on %s: %w", name, stream, lastErr)
}

// consumerCleanupWait is how long to let the server finish deleting a
// consumer's folder before a consumer of the same name is created again.
const consumerCleanupWait = time.Second

// serverFailure reports whether err is the server failing (a 5xx JetStream
// API error, e.g. 10012 "open .../obs/<name>/meta.inf.tmp: no such file"),
// not a refusal of the request.
func serverFailure(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Code >= 500
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// skips reports whether a consumer configured as c may skip an event
// after the inbox's position pos (0: unknown, so only DeliverAll is sure).
func skips(c jetstream.ConsumerConfig, pos uint64) bool {
	switch c.DeliverPolicy {
	case jetstream.DeliverAllPolicy:
		return false
	case jetstream.DeliverByStartSequencePolicy:
		return c.OptStartSeq > pos+1
	default: // new, last, last per subject, by start time
		return true
	}
}

// adopt makes cons the consumer Check reads and the watch compares with.
// Its ack floor is a safe position: ensure never adopts a consumer that
// starts after the inbox's position.
func (in *Inbox) adopt(cons jetstream.Consumer) {
	ci := cons.CachedInfo()
	in.created.Store(ci.Created.UnixNano())
	in.floor.Store(ci.AckFloor.Stream)
	in.lastSeen.Store(time.Now().UnixNano())
	in.cons.Store(&cons)
}

// streamRow is what inbox_position records of the consumer's stream.
type streamRow = dbsqlc.InboxStreamLockRow

// readStream reads the stream's info, with its creation time and first
// and last sequences. An error wraps jetstream.ErrStreamNotFound when the
// stream does not exist.
func (in *Inbox) readStream(ctx context.Context) (*jetstream.StreamInfo, error) {
	s, err := in.cfg.JetStream.Stream(ctx, in.cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", in.cfg.Stream, err)
	}
	return s.CachedInfo(), nil
}

// judge compares the stream st with what row records of the stream the
// position counts on, and with what this process saw of it: it returns
// the inbox's position on st (the ack floor; 0 when unknown or when st is
// another stream) and, when st is another stream, why.
//
// Another stream: one whose creation time differs from the recorded one
// (deleted and made again: JetStream StreamInfo.Created is set when a
// stream is created, the same on every replica of a clustered stream, and
// kept by a server restart and by a restore), or whose last sequence is
// below the last one seen on it (restored from an older store: sequences
// never go back on one stream, and a purge keeps them), or, for a row
// written before the creation time was recorded, below the position.
// Neither a purge nor messages aged out by the stream's limits is a new
// stream: the sequences go on and the position stays true.
func (in *Inbox) judge(st *jetstream.StreamInfo, row streamRow) (pos uint64, why string) {
	created := st.Created.Truncate(time.Microsecond)
	pos, last := uint64(max(row.AckFloor, 0)), uint64(max(row.LastSeq, 0))
	if in.streamCreated.Load() == created.UnixMicro() && (row.StreamCreated == nil || row.StreamCreated.Equal(created)) {
		// What this process saw counts only on the stream it saw it on.
		pos, last = max(pos, in.floor.Load()), max(last, in.lastSeq.Load())
	}
	switch {
	case row.StreamCreated != nil && !row.StreamCreated.Equal(created):
		return 0, fmt.Sprintf("the stream was created %s; the inbox's position %d counts on the stream created %s (deleted and made again?)",
			created.UTC().Format(time.RFC3339Nano), pos, row.StreamCreated.UTC().Format(time.RFC3339Nano))
	case st.State.LastSeq < last:
		return 0, fmt.Sprintf("the stream's last sequence %d is below %d, the last the inbox saw on it (restored from an older store?)", st.State.LastSeq, last)
	case st.State.LastSeq < pos:
		return 0, fmt.Sprintf("the stream's last sequence %d is below the inbox's position %d (restored or recreated?)", st.State.LastSeq, pos)
	}
	return pos, ""
}

// checkStream reads the stream and the consumer's inbox_position row,
// locked in tx, judges whether the stream is the one the position counts
// on (see [Inbox.judge]), and records the stream in the row: its creation
// time and first and last sequences, and, when it is another stream, a
// position of 0, so that the consumer reads it from its first message (the
// inbox table drops the events handled already); ensure logs that at error
// level and counts it (tripsaga_inbox_consumer_lost_total, reason
// stream_replaced) once tx commits. It returns the position on the stream
// as it is, the stream's info, and why it is another stream ("" if not).
func (in *Inbox) checkStream(ctx context.Context, tx pgx.Tx) (uint64, *jetstream.StreamInfo, string, error) {
	st, err := in.readStream(ctx)
	if err != nil {
		return 0, nil, "", err
	}
	key := dbsqlc.InboxPositionEnsureParams{Consumer: in.cfg.Name, Stream: in.cfg.Stream}
	if err := queries.InboxPositionEnsure(ctx, tx, key); err != nil {
		return 0, nil, "", fmt.Errorf("inbox position: %w", err)
	}
	row, err := queries.InboxStreamLock(ctx, tx, dbsqlc.InboxStreamLockParams(key))
	if err != nil {
		return 0, nil, "", fmt.Errorf("inbox position: %w", err)
	}
	pos, why := in.judge(st, row)
	if why == "" && pos > 0 && st.State.FirstSeq > pos+1 && uint64(max(row.FirstSeq, 0)) != st.State.FirstSeq {
		// Purged, or aged out by the stream's limits, before this
		// consumer read them: nothing of it can be read again.
		in.cfg.Logger.With("consumer", in.cfg.Name, "stream", in.cfg.Stream).Warn("inbox: the stream's first message is past the inbox's position: the messages between were removed (purged, or aged out) before this consumer read them",
			"position", pos, "first_seq", st.State.FirstSeq)
	}
	created := st.Created.Truncate(time.Microsecond)
	last := st.State.LastSeq
	if why == "" {
		last = max(last, uint64(max(row.LastSeq, 0)))
	}
	err = queries.InboxStreamRecord(ctx, tx, dbsqlc.InboxStreamRecordParams{
		Consumer: in.cfg.Name, Stream: in.cfg.Stream, AckFloor: int64(pos), StreamCreated: &created,
		FirstSeq: int64(st.State.FirstSeq), LastSeq: int64(last),
	})
	if err != nil {
		return 0, nil, "", fmt.Errorf("inbox position: %w", err)
	}
	return pos, st, why, nil
}

// StartSeq is the stream sequence a missing durable consumer would be
// recreated from now: one past the inbox's position, its ack floor as last
// seen by this process or stored in inbox_position. Events are acked out
// of order by several workers and batches, so the last handled sequence
// (the inbox table's highest stream_seq) is not safe; the ack floor is,
// since every event at or below it was acked, and the inbox acks only
// after its transaction committed or the event was parked. Events after it
// that were handled already come again and are dropped as duplicates by
// the inbox table. It returns 0 (deliver all) when no position is known,
// or when the stream is not the one the position counts on (see
// [Inbox.judge]: deleted and made again, restored from an older store):
// when unsure, start earlier. It only reads; ensure decides and records.
func (in *Inbox) StartSeq(ctx context.Context) (uint64, error) {
	st, err := in.readStream(ctx)
	if err != nil {
		return 0, err
	}
	got, err := queries.InboxStreamGet(ctx, in.cfg.Pool, dbsqlc.InboxStreamGetParams{Consumer: in.cfg.Name, Stream: in.cfg.Stream})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("inbox position: %w", err)
	}
	pos, why := in.judge(st, streamRow(got))
	if why != "" || pos == 0 {
		return 0, nil
	}
	return pos + 1, nil
}

func (in *Inbox) prefetch() int {
	prefetch := 2 * in.cfg.Concurrency
	if in.cfg.BatchApply != nil {
		prefetch = max(prefetch, in.cfg.BatchSize)
	}
	return prefetch
}

// work handles the messages of work, alone or in batches, until it is
// closed. Messages of a consumer that was lost are still handled; their
// acks go nowhere and the recreated consumer delivers them again, which
// the inbox drops as duplicates.
func (in *Inbox) work(ctx context.Context, work chan jetstream.Msg) {
	for msg := range work {
		if in.cfg.BatchApply == nil {
			in.handle(ctx, msg)
			continue
		}
		batch := []jetstream.Msg{msg}
	more:
		for len(batch) < in.cfg.BatchSize {
			select {
			case m, ok := <-work:
				if !ok {
					break more
				}
				batch = append(batch, m)
			default:
				break more
			}
		}
		in.handleBatch(ctx, batch)
	}
}

// consume feeds work from cons until ctx ends (it returns "") or the
// consumer is lost (it returns a Lost* reason and what was seen).
func (in *Inbox) consume(ctx context.Context, cons jetstream.Consumer, work chan<- jetstream.Msg) (reason, detail string) {
	type lostMsg struct{ reason, detail string }
	lost := make(chan lostMsg, 1)
	signal := func(r, d string) {
		select {
		case lost <- lostMsg{r, d}:
		default:
		}
	}
	look := make(chan struct{}, 1)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		in.lastSeen.Store(time.Now().UnixNano())
		select {
		case work <- msg:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(in.prefetch()), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if ctx.Err() != nil {
			return
		}
		switch {
		case errors.Is(err, jetstream.ErrConsumerDeleted):
			signal(LostDeleted, err.Error())
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			signal(LostMissing, err.Error())
		case errors.Is(err, jetstream.ErrNoHeartbeat), errors.Is(err, nats.ErrNoResponders):
			// The consumer may be gone, or only the connection: look now.
			select {
			case look <- struct{}{}:
			default:
			}
			in.cfg.Logger.Debug("inbox consume", "consumer", in.cfg.Name, "err", err)
		default:
			in.cfg.Logger.Debug("inbox consume", "consumer", in.cfg.Name, "err", err)
		}
	}))
	if err != nil {
		if ctx.Err() != nil {
			return "", ""
		}
		return LostStopped, fmt.Sprintf("consume: %v", err)
	}
	closed := cc.Closed()
	stop := func() {
		cc.Stop()
		<-closed
	}
	t := time.NewTicker(in.cfg.WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			stop()
			return "", ""
		case l := <-lost:
			stop()
			return l.reason, l.detail
		case <-closed:
			select {
			case l := <-lost:
				return l.reason, l.detail
			default:
			}
			if ctx.Err() != nil {
				return "", ""
			}
			return LostStopped, "the client stopped consuming"
		case <-t.C:
		case <-look:
		}
		if r, d := in.watch(ctx, cons); r != "" {
			stop()
			return r, d
		}
	}
}

// watch reads the stream's and the consumer's info: it returns a Lost*
// reason when the stream is not the one the consumer was made on (see
// [Inbox.judge]), or the consumer is gone, was replaced or reset, and
// otherwise records its ack floor (in inbox_position when it moved, with
// the stream it counts on). An info that cannot be read (NATS unreachable)
// is no verdict: the client reconnects by itself and Check reports it
// meanwhile.
func (in *Inbox) watch(ctx context.Context, cons jetstream.Consumer) (reason, detail string) {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := in.readStream(ictx)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return LostMissing, err.Error()
	case err != nil:
		in.cfg.Logger.Debug("inbox: stream info", "consumer", in.cfg.Name, "err", err)
		return "", ""
	}
	if c := st.Created.Truncate(time.Microsecond); c.UnixMicro() != in.streamCreated.Load() {
		in.noticed.Store(true)
		return LostStreamReplaced, fmt.Sprintf("the stream was created %s, the consumer's %s", c.UTC().Format(time.RFC3339Nano), time.UnixMicro(in.streamCreated.Load()).UTC().Format(time.RFC3339Nano))
	}
	if l := in.lastSeq.Load(); st.State.LastSeq < l {
		in.noticed.Store(true)
		return LostStreamReplaced, fmt.Sprintf("the stream's last sequence went back from %d to %d (restored from an older store?)", l, st.State.LastSeq)
	}
	info, err := cons.Info(ictx)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		return LostMissing, err.Error()
	case err != nil:
		in.cfg.Logger.Debug("inbox: consumer info", "consumer", in.cfg.Name, "err", err)
		return "", ""
	case info.Created.UnixNano() != in.created.Load():
		return LostReplaced, fmt.Sprintf("created %s, ours %s", info.Created.UTC().Format(time.RFC3339Nano), time.Unix(0, in.created.Load()).UTC().Format(time.RFC3339Nano))
	case info.AckFloor.Stream < in.floor.Load():
		in.floor.Store(info.AckFloor.Stream)
		return LostReset, fmt.Sprintf("ack floor went back to %d", info.AckFloor.Stream)
	}
	// The stream's info was read before the consumer's: its last sequence
	// is one the floor has not passed.
	in.lastSeq.Store(max(in.lastSeq.Load(), st.State.LastSeq))
	if f := info.AckFloor.Stream; f > in.floor.Load() || !in.stored.Load() {
		in.floor.Store(f)
		created := time.UnixMicro(in.streamCreated.Load())
		err := queries.InboxPositionSet(ictx, in.cfg.Pool, dbsqlc.InboxPositionSetParams{
			Consumer: in.cfg.Name, Stream: in.cfg.Stream, AckFloor: int64(f),
			StreamCreated: &created, FirstSeq: int64(st.State.FirstSeq), LastSeq: int64(in.lastSeq.Load()),
		})
		if err != nil {
			in.cfg.Logger.Debug("inbox: store position", "consumer", in.cfg.Name, "err", err)
		}
		in.stored.Store(err == nil)
	}
	return "", ""
}

// handle never panics and never blocks the stream: every message ends
// acked (handled, duplicate, parked) or nak'd with a delay.
func (in *Inbox) handle(ctx context.Context, msg jetstream.Msg) {
	log := in.cfg.Logger.With("consumer", in.cfg.Name, "subject", msg.Subject())
	md, err := msg.Metadata()
	if err != nil {
		log.Error("inbox: message without metadata", "err", err)
		_ = msg.Term()
		return
	}
	e, err := events.Decode(msg.Headers(), msg.Data())
	if err != nil {
		in.park(ctx, msg, md, fmt.Sprintf("cannot decode: %v", err))
		return
	}
	// One span per event handled, a child of its producer's (traceparent).
	ctx, span := tracing.StartConsume(ctx, in.cfg.Name, md.Stream, e)
	outcome := "parked"
	defer func() { endConsume(span, outcome, err) }()
	if !in.types[e.Type()] {
		in.park(ctx, msg, md, fmt.Sprintf("%v: %q", events.ErrUnknownType, e.Type()))
		return
	}
	log = log.With("event_id", e.ID(), "trip_id", e.Subject(), "type", e.Type())
	dup, err := in.process(ctx, e, md)
	switch {
	case err == nil && dup:
		outcome = "duplicate"
		in.cfg.Metrics.inc(in.cfg.Name, "duplicate")
		log.Debug("inbox: duplicate dropped")
		_ = msg.Ack()
	case err == nil:
		outcome = "handled"
		in.cfg.Metrics.inc(in.cfg.Name, "handled")
		if fault.Hit(ctx, fault.At(in.cfg.Name, "inbox", fault.AfterCommit), e.Subject()) != nil {
			return // as if the ack were lost: redelivered after AckWait, acked as a duplicate
		}
		_ = msg.Ack()
		if in.cfg.OnCommitted != nil {
			in.cfg.OnCommitted(e)
		}
	case errors.Is(err, ErrPermanent) || errors.Is(err, events.ErrInvalidEvent) || errors.Is(err, events.ErrUnknownType):
		in.park(ctx, msg, md, err.Error())
	case int(md.NumDelivered) >= in.cfg.MaxDeliver && in.cfg.Pool.Ping(ctx) == nil:
		in.park(ctx, msg, md, fmt.Sprintf("still failing after %d deliveries: %v", md.NumDelivered, err))
	default:
		outcome = "retried"
		if ctx.Err() != nil {
			return // shutting down: the server redelivers after AckWait
		}
		in.cfg.Metrics.inc(in.cfg.Name, "retried")
		d := time.Duration(math.Min(float64(200*time.Millisecond)*math.Pow(2, float64(md.NumDelivered-1)), float64(in.cfg.BackoffMax)))
		log.Warn("inbox: handler failed; redelivering", "err", err, "delivery", md.NumDelivered, "delay", d)
		_ = msg.NakWithDelay(d)
	}
}

// endConsume ends a consume span with the event's outcome (handled,
// duplicate, parked, retried) and the handler's error.
func endConsume(span trace.Span, outcome string, err error) {
	if span.IsRecording() {
		span.SetAttributes(tracing.KeyOutcome.String(outcome))
	}
	tracing.End(span, err)
}

// handleBatch applies msgs in one transaction with BatchApply and acks
// them after commit; events that cannot be decoded or are of an unknown
// type are parked one by one, and if the batch fails each event is handled
// alone (handle), so one bad event fails only itself.
func (in *Inbox) handleBatch(ctx context.Context, msgs []jetstream.Msg) {
	ds := make([]Delivery, 0, len(msgs))
	ok := make([]jetstream.Msg, 0, len(msgs))
	for _, msg := range msgs {
		md, err := msg.Metadata()
		if err != nil {
			in.handle(ctx, msg)
			continue
		}
		e, err := events.Decode(msg.Headers(), msg.Data())
		if err != nil || !in.types[e.Type()] {
			in.handle(ctx, msg) // parks it with the reason
			continue
		}
		ds = append(ds, Delivery{Event: e, Stream: md.Stream, Seq: md.Sequence.Stream})
		ok = append(ok, msg)
	}
	if len(ds) == 0 {
		return
	}
	if tracing.Enabled() {
		// A span per event, each a child of its own producer's.
		for i := range ds {
			_, ds[i].span = tracing.StartConsume(ctx, in.cfg.Name, ds[i].Stream, ds[i].Event)
			ds[i].span.SetAttributes(tracing.KeyOutcome.String("handled"), attribute.Int("messaging.batch.message_count", len(ds)))
		}
	}
	err := in.applyBatch(ctx, ds)
	for _, d := range ds {
		if d.span != nil {
			if err != nil {
				d.span.SetAttributes(tracing.KeyOutcome.String("batch_failed"))
			}
			tracing.End(d.span, err)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return // the server redelivers after AckWait
		}
		in.cfg.Logger.Warn("inbox: batch failed; handling its events one by one", "consumer", in.cfg.Name, "events", len(ds), "err", err)
		for _, msg := range ok {
			in.handle(ctx, msg)
		}
		return
	}
	if fault.HitAny(ctx, fault.At(in.cfg.Name, "inbox", fault.AfterCommit), len(ds), func(i int) string { return ds[i].Event.Subject() }) != nil {
		return // as if the acks were lost
	}
	for i, msg := range ok {
		in.cfg.Metrics.inc(in.cfg.Name, "handled")
		_ = msg.Ack()
		if in.cfg.OnCommitted != nil {
			in.cfg.OnCommitted(ds[i].Event)
		}
	}
}

func (in *Inbox) applyBatch(ctx context.Context, ds []Delivery) (err error) {
	if in.cfg.BatchLock != nil {
		in.cfg.BatchLock.Lock()
		defer in.cfg.BatchLock.Unlock()
	}
	tx, err := in.cfg.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	ctx, committed := WithAfterCommit(ctx, in.cfg.Relay)
	func() {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("batch handler panic: %v\n%s", r, debug.Stack())
			}
		}()
		err = in.cfg.BatchApply(ctx, tx, in.cfg.Name, ds)
	}()
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	committed()
	return nil
}

// process runs the handler and the inbox insert in one transaction. A
// panic in the handler becomes an error.
func (in *Inbox) process(ctx context.Context, e event.Event, md *jetstream.MsgMetadata) (dup bool, err error) {
	tx, err := in.cfg.Pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	ctx, committed := WithAfterCommit(ctx, in.cfg.Relay)
	n, err := queries.InboxInsertIfAbsent(ctx, tx, dbsqlc.InboxInsertIfAbsentParams{
		Consumer: in.cfg.Name, Source: e.Source(), EventID: e.ID(), CeType: e.Type(),
		Stream: md.Stream, StreamSeq: int64(md.Sequence.Stream),
	})
	if err != nil {
		return false, fmt.Errorf("inbox insert: %w", err)
	}
	if n == 0 {
		return true, nil
	}
	if err := in.safeHandle(ctx, tx, e); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		// It may have committed (pgx #2110); a redelivery finds the inbox
		// row if so.
		return false, fmt.Errorf("commit: %w", err)
	}
	committed()
	return false, nil
}

func (in *Inbox) safeHandle(ctx context.Context, tx pgx.Tx, e event.Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panic: %v\n%s", r, debug.Stack())
		}
	}()
	return in.cfg.Handler(ctx, tx, e)
}

// park copies msg to the dead-letter stream with the reason and acks it.
// If the copy cannot be stored the message is nak'd and tried again later.
func (in *Inbox) park(ctx context.Context, msg jetstream.Msg, md *jetstream.MsgMetadata, reason string) {
	in.cfg.Logger.Error("inbox: event parked in dead-letter stream", "consumer", in.cfg.Name, "subject", msg.Subject(), "stream_seq", md.Sequence.Stream, "reason", reason)
	dl := &nats.Msg{
		Subject: events.DeadLetterSubjectPrefix + "." + md.Stream + "." + in.cfg.Name,
		Data:    msg.Data(),
		Header:  nats.Header{},
	}
	for k, v := range msg.Headers() {
		if k == jetstream.MsgIDHeader {
			continue
		}
		dl.Header[k] = v
	}
	dl.Header[HeaderDeadReason] = []string{reason}
	dl.Header[HeaderDeadStream] = []string{md.Stream}
	dl.Header[HeaderDeadSeq] = []string{strconv.FormatUint(md.Sequence.Stream, 10)}
	dl.Header[HeaderDeadSubject] = []string{msg.Subject()}
	dl.Header[HeaderDeadConsumer] = []string{in.cfg.Name}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	id := fmt.Sprintf("dead-%s-%s-%d", md.Stream, in.cfg.Name, md.Sequence.Stream)
	if _, err := in.cfg.JetStream.PublishMsg(pctx, dl, jetstream.WithMsgID(id)); err != nil {
		in.cfg.Logger.Error("inbox: cannot park event; will retry", "err", err)
		_ = msg.NakWithDelay(5 * time.Second)
		return
	}
	in.cfg.Metrics.inc(in.cfg.Name, "parked")
	_ = msg.Ack()
}

// HandlerBatch makes a [BatchFunc] of h: in the batch's one transaction,
// one statement writes every delivery's inbox row, and h runs for each
// event the inbox did not have yet, in trip order (CloudEvents subject) so
// that concurrent batches lock rows in the same order. h must be correct
// when run for several events in one transaction, as it is when they come
// one by one.
func HandlerBatch(h HandlerFunc) BatchFunc {
	return func(ctx context.Context, tx pgx.Tx, consumer string, ds []Delivery) error {
		ds = slices.Clone(ds)
		slices.SortStableFunc(ds, func(a, b Delivery) int { return strings.Compare(a.Event.Subject(), b.Event.Subject()) })
		p := dbsqlc.InboxInsertManyIfAbsentParams{Consumer: consumer, Stream: ds[0].Stream}
		for _, d := range ds {
			p.Sources = append(p.Sources, d.Event.Source())
			p.EventIds = append(p.EventIds, d.Event.ID())
			p.CeTypes = append(p.CeTypes, d.Event.Type())
			p.Seqs = append(p.Seqs, int64(d.Seq))
		}
		fresh, err := queries.InboxInsertManyIfAbsent(ctx, tx, p)
		if err != nil {
			return fmt.Errorf("inbox insert: %w", err)
		}
		todo := make(map[[2]string]bool, len(fresh))
		for _, f := range fresh {
			todo[[2]string{f.Source, f.EventID}] = true
		}
		for _, d := range ds {
			k := [2]string{d.Event.Source(), d.Event.ID()}
			if !todo[k] {
				if d.span != nil {
					d.span.SetAttributes(tracing.KeyOutcome.String("duplicate"))
				}
				continue // the inbox had it, or it came twice in this batch
			}
			delete(todo, k)
			if err := h(d.Context(ctx), tx, d.Event); err != nil {
				return fmt.Errorf("event %s: %w", d.Event.ID(), err)
			}
		}
		return nil
	}
}
