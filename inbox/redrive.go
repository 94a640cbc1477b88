package inbox

import (
	"context"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/events"
	dbsqlc "github.com/tripsaga/tripsaga/inbox/internal/dbsqlc"
)

// Name returns the inbox's durable consumer name (its dedup scope).
func (in *Inbox) Name() string { return in.cfg.Name }

// Stream returns the stream the inbox consumes.
func (in *Inbox) Stream() string { return in.cfg.Stream }

// Redeliver hands e, an event this inbox's consumer parked on the
// dead-letter stream (stream and seq say where it was consumed from), to
// the inbox's handler once more inside tx, behind this consumer's inbox
// row, as a delivery would: dup is true, and the handler does not run,
// when the inbox has the event already. Only this consumer sees it, which
// is what an operator's re-drive asks for (no other consumer of the
// stream is touched).
//
// An event of a type the inbox does not handle returns an error wrapping
// [ErrPermanent] and [events.ErrUnknownType]; the handler's error is
// returned as it is, and tx is then to be rolled back.
func (in *Inbox) Redeliver(ctx context.Context, tx pgx.Tx, e event.Event, stream string, seq uint64) (dup bool, err error) {
	if !in.types[e.Type()] {
		return false, fmt.Errorf("%w: %w: consumer %s does not handle %q", ErrPermanent, events.ErrUnknownType, in.cfg.Name, e.Type())
	}
	n, err := queries.InboxInsertIfAbsent(ctx, tx, dbsqlc.InboxInsertIfAbsentParams{
		Consumer: in.cfg.Name, Source: e.Source(), EventID: e.ID(), CeType: e.Type(),
		Stream: stream, StreamSeq: int64(seq),
	})
	if err != nil {
		return false, fmt.Errorf("inbox insert: %w", err)
	}
	if n == 0 {
		return true, nil
	}
	return false, in.safeHandle(ctx, tx, e)
}

// RedriveParked hands the parked event p to the inbox among ins that
// parked it (the one named p.Consumer on p.Stream) inside tx, with
// [Inbox.Redeliver]. The error wraps [ErrPermanent] when p cannot be
// decoded or no inbox of ins is the one that parked it.
func RedriveParked(ctx context.Context, tx pgx.Tx, p *events.ParkedEvent, ins ...*Inbox) (dup bool, err error) {
	if p == nil {
		return false, fmt.Errorf("%w: a re-drive without its dead letter", ErrPermanent)
	}
	var in *Inbox
	for _, i := range ins {
		if i.cfg.Name == p.Consumer && i.cfg.Stream == p.Stream {
			in = i
		}
	}
	if in == nil {
		return false, fmt.Errorf("%w: no inbox %s on stream %s here to re-drive dead letter %d into", ErrPermanent, p.Consumer, p.Stream, p.Seq)
	}
	e, err := events.Decode(p.Headers, p.Data)
	if err != nil {
		return false, fmt.Errorf("%w: dead letter %d still cannot be decoded: %w", ErrPermanent, p.Seq, err)
	}
	return in.Redeliver(ctx, tx, e, p.Stream, p.StreamSeq)
}
