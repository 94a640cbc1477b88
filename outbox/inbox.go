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

	"github.com/tripsaga/tripsaga/events"
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
	// events.
	Metrics *InboxMetrics
}

// InboxMetrics are shared by all inboxes of a process.
type InboxMetrics struct {
	events *prometheus.CounterVec
}

// NewInboxMetrics registers the inbox counters on reg.
func NewInboxMetrics(reg prometheus.Registerer) (*InboxMetrics, error) {
	m := &InboxMetrics{events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tripsaga_inbox_events_total",
		Help: "Events seen by inbox consumers, by outcome (handled, duplicate, retried, parked).",
	}, []string{"consumer", "outcome"})}
	if reg != nil {
		if err := reg.Register(m.events); err != nil {
			return nil, err
		}
	}
	return m, nil
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
}

// ErrStalled is returned by [Inbox.Check] when the consumer has messages
// waiting but none arrived for a while: a pull consumer can stall silently
// after a reconnect or leader change (nats.go #1729).
var ErrStalled = errors.New("outbox: inbox consumer stalled")

// CheckAll runs [Inbox.Check] on each inbox and returns the first error.
func CheckAll(ctx context.Context, inboxes ...*Inbox) error {
	for _, in := range inboxes {
		if err := in.Check(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Check reports whether the consumer makes progress: it returns an error
// wrapping [ErrStalled] when the server holds undelivered messages for it
// and none arrived during the last 2×AckWait (at least 10 s), or an error
// when the consumer's info cannot be read. Use it in a readiness check.
func (in *Inbox) Check(ctx context.Context) error {
	cp := in.cons.Load()
	if cp == nil {
		return fmt.Errorf("inbox %s: consumer not created yet", in.cfg.Name)
	}
	info, err := (*cp).Info(ctx)
	if err != nil {
		return fmt.Errorf("inbox %s: %w", in.cfg.Name, err)
	}
	quiet := time.Since(time.Unix(0, in.lastSeen.Load()))
	if info.NumPending > 0 && quiet > max(2*in.cfg.AckWait, 10*time.Second) {
		return fmt.Errorf("%w: %s on %s has %d waiting, nothing arrived for %s", ErrStalled, in.cfg.Name, in.cfg.Stream, info.NumPending, quiet.Round(time.Second))
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
// ends.
func (in *Inbox) Run(ctx context.Context) error {
	cons, err := in.cfg.JetStream.CreateOrUpdateConsumer(ctx, in.cfg.Stream, jetstream.ConsumerConfig{
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
	})
	if err != nil {
		return fmt.Errorf("inbox %s: consumer on %s: %w", in.cfg.Name, in.cfg.Stream, err)
	}
	in.lastSeen.Store(time.Now().UnixNano())
	in.cons.Store(&cons)
	return in.consume(ctx, cons)
}

func (in *Inbox) consume(ctx context.Context, cons jetstream.Consumer) error {
	prefetch := 2 * in.cfg.Concurrency
	if in.cfg.BatchApply != nil {
		prefetch = max(prefetch, in.cfg.BatchSize)
	}
	work := make(chan jetstream.Msg, prefetch)
	var wg sync.WaitGroup
	for range in.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
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
		}()
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		in.lastSeen.Store(time.Now().UnixNano())
		select {
		case work <- msg:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(prefetch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if ctx.Err() == nil {
			in.cfg.Logger.Debug("inbox consume", "consumer", in.cfg.Name, "err", err)
		}
	}))
	if err != nil {
		close(work)
		wg.Wait()
		return fmt.Errorf("inbox %s: consume: %w", in.cfg.Name, err)
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	close(work)
	wg.Wait()
	return nil
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
	if !in.types[e.Type()] {
		in.park(ctx, msg, md, fmt.Sprintf("%v: %q", events.ErrUnknownType, e.Type()))
		return
	}
	log = log.With("event_id", e.ID(), "trip_id", e.Subject(), "type", e.Type())
	dup, err := in.process(ctx, e, md)
	switch {
	case err == nil && dup:
		in.cfg.Metrics.inc(in.cfg.Name, "duplicate")
		log.Debug("inbox: duplicate dropped")
		_ = msg.Ack()
	case err == nil:
		in.cfg.Metrics.inc(in.cfg.Name, "handled")
		_ = msg.Ack()
		if in.cfg.OnCommitted != nil {
			in.cfg.OnCommitted(e)
		}
	case errors.Is(err, ErrPermanent) || errors.Is(err, events.ErrInvalidEvent) || errors.Is(err, events.ErrUnknownType):
		in.park(ctx, msg, md, err.Error())
	case int(md.NumDelivered) >= in.cfg.MaxDeliver && in.cfg.Pool.Ping(ctx) == nil:
		in.park(ctx, msg, md, fmt.Sprintf("still failing after %d deliveries: %v", md.NumDelivered, err))
	default:
		if ctx.Err() != nil {
			return // shutting down: the server redelivers after AckWait
		}
		in.cfg.Metrics.inc(in.cfg.Name, "retried")
		d := time.Duration(math.Min(float64(200*time.Millisecond)*math.Pow(2, float64(md.NumDelivered-1)), float64(in.cfg.BackoffMax)))
		log.Warn("inbox: handler failed; redelivering", "err", err, "delivery", md.NumDelivered, "delay", d)
		_ = msg.NakWithDelay(d)
	}
}

// process runs the handler and the inbox insert in one transaction. A
// panic in the handler becomes an error.
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
	err := in.applyBatch(ctx, ds)
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
				continue // the inbox had it, or it came twice in this batch
			}
			delete(todo, k)
			if err := h(ctx, tx, d.Event); err != nil {
				return fmt.Errorf("event %s: %w", d.Event.ID(), err)
			}
		}
		return nil
	}
}
