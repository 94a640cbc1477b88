package inbox

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
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
