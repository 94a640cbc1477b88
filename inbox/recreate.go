package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

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
