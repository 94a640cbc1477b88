package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	dbsqlc "github.com/tripsaga/tripsaga/inbox/internal/dbsqlc"
	"github.com/tripsaga/tripsaga/outbox"
)

// Inbox defaults.
const (
	MaxDeliverDefault  = 25
	AckWaitDefault     = 5 * time.Second
	ConcurrencyDefault = 4
	BackoffMaxDefault  = 15 * time.Second
)

// ErrPermanent marks a handler error that no retry can cure (a payload the
// handler cannot use): the event is parked at once. Wrap it:
// fmt.Errorf("%w: no trip id", inbox.ErrPermanent). Errors wrapping
// events.ErrInvalidEvent or events.ErrUnknownType are treated the same.
var ErrPermanent = errors.New("inbox: permanent handler error")

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
// Config.BatchApply.
type BatchFunc func(ctx context.Context, tx pgx.Tx, consumer string, ds []Delivery) error

// Config configures an [Inbox].
type Config struct {
	// Name is the durable consumer name and the inbox's dedup scope.
	// Required.
	Name string
	// Stream to consume. Required.
	Stream string
	// FilterSubjects select the events (e.g. "stock.reserved.>"). Required.
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
	// registered with AfterCommit run then (see outbox.WithAfterCommit).
	Relay *outbox.Relay
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
	Metrics *Metrics
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

func (c *Config) setDefaults() {
	if c.MaxDeliver == 0 {
		c.MaxDeliver = MaxDeliverDefault
	}
	if c.AckWait == 0 {
		c.AckWait = AckWaitDefault
	}
	if c.Concurrency == 0 {
		c.Concurrency = ConcurrencyDefault
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = BackoffMaxDefault
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

func (c *Config) validate() error {
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
	cfg   Config
	types map[string]bool
	// awaitingStream is true while Run waits for its stream to appear
	// (see [ErrStreamAppeared]).
	awaitingStream atomic.Bool
	// uow runs each event's (or batch's) transaction: inbox rows, effect,
	// and the relay's publish of what the handler wrote, after its commit.
	uow  outbox.UnitOfWork
	cons atomic.Pointer[jetstream.Consumer]
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

// New returns an inbox; it returns an error wrapping
// [ErrInvalidConfig] for a bad cfg.
func New(cfg Config) (*Inbox, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	in := &Inbox{cfg: cfg, types: map[string]bool{}, uow: outbox.UnitOfWork{Pool: cfg.Pool, Relay: cfg.Relay}}
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
		in.awaitingStream.Store(true)
		in.cfg.Logger.Warn("inbox: the stream does not exist yet (its service creates it at start, or tripsaga streams apply); consuming once it appears",
			"consumer", in.cfg.Name, "stream", in.cfg.Stream)
		// While it waits (for as long as the stream's service is not run:
		// the stream of an optional step the system runs without, say), a
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
		in.awaitingStream.Store(false) // the consumer is created now (ensure), or Run ends
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

// queries are the inbox's generated queries (sql/queries/inbox, sqlc).
var queries = dbsqlc.New() //nolint:gochecknoglobals // stateless

// ErrInvalidConfig is wrapped by [New] given a bad [Config].
var ErrInvalidConfig = errors.New("inbox: invalid config")
