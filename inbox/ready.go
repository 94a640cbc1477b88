package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrStalled is returned by [Inbox.Check] when the consumer has messages
// waiting but none arrived for a while: a pull consumer can stall silently
// after a reconnect or leader change (nats.go #1729).
var ErrStalled = errors.New("inbox: consumer stalled")

// ErrStreamMissing is returned by [Inbox.Check] when the inbox's stream
// does not exist: not created yet by the service that owns it (each
// service's NATS identity may create only its own, natsauth), or
// deleted. [Inbox.Run] waits for it and consumes once it appears.
var ErrStreamMissing = errors.New("inbox: the stream does not exist")

// ErrStreamAppeared wraps [ErrStreamMissing]: the stream an inbox was
// waiting for exists now, and [Inbox.Run] creates its consumer at its next
// look (within [StreamWaitMax]). Like a missing stream it fails no
// readiness: a process that waited in any order is not made unready by
// the stream it waited for appearing.
var ErrStreamAppeared = fmt.Errorf("%w yet for its consumer: it has just appeared", ErrStreamMissing)

// CheckAll runs [Readiness] on the inboxes and returns its error: the
// first inbox that fails readiness.
func CheckAll(ctx context.Context, inboxes ...*Inbox) error {
	_, err := Readiness(ctx, inboxes...)
	return err
}

// Wait is an inbox that is not consuming, or not well, without
// failing readiness: its stream does not exist (yet), or it is
// [Config.Optional].
type Wait struct {
	Consumer string // the durable consumer's name (Config.Name)
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
func Readiness(ctx context.Context, inboxes ...*Inbox) (waits []Wait, err error) {
	for _, in := range inboxes {
		cerr := in.Check(ctx)
		switch {
		case cerr == nil:
		case in.cfg.Optional || errors.Is(cerr, ErrStreamMissing):
			waits = append(waits, Wait{Consumer: in.cfg.Name, Stream: in.cfg.Stream, Err: cerr})
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
		if in.awaitingStream.Load() {
			return fmt.Errorf("%w: %s (inbox %s creates its consumer within %s)", ErrStreamAppeared, in.cfg.Stream, in.cfg.Name, StreamWaitMax)
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
