package inbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tripsaga/tripsaga/events"
	dbsqlc "github.com/tripsaga/tripsaga/inbox/internal/dbsqlc"
	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/internal/tracing"
)

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
	return in.uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("batch handler panic: %v\n%s", r, debug.Stack())
			}
		}()
		return in.cfg.BatchApply(ctx, tx, in.cfg.Name, ds)
	})
}

// process runs the handler and the inbox insert in one transaction. A
// panic in the handler becomes an error.
func (in *Inbox) process(ctx context.Context, e event.Event, md *jetstream.MsgMetadata) (dup bool, err error) {
	// A COMMIT whose answer is lost may have committed (pgx #2110): a
	// redelivery finds the inbox row if so.
	err = in.uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		n, err := queries.InboxInsertIfAbsent(ctx, tx, dbsqlc.InboxInsertIfAbsentParams{
			Consumer: in.cfg.Name, Source: e.Source(), EventID: e.ID(), CeType: e.Type(),
			Stream: md.Stream, StreamSeq: int64(md.Sequence.Stream),
		})
		if err != nil {
			return fmt.Errorf("inbox insert: %w", err)
		}
		if n == 0 {
			return errDuplicate
		}
		return in.safeHandle(ctx, tx, e)
	})
	if errors.Is(err, errDuplicate) {
		return true, nil
	}
	return false, err
}

// errDuplicate rolls back process's transaction: the inbox has the event.
var errDuplicate = errors.New("inbox: the event was handled before")

func (in *Inbox) safeHandle(ctx context.Context, tx pgx.Tx, e event.Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panic: %v\n%s", r, debug.Stack())
		}
	}()
	return in.cfg.Handler(ctx, tx, e)
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
