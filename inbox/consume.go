package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	dbsqlc "github.com/tripsaga/tripsaga/inbox/internal/dbsqlc"
)

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
