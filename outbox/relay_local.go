package outbox

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/internal/tracing"
	"github.com/tripsaga/tripsaga/outbox/internal/dbsqlc"
)

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

// relayMarkGather is how long acked local events gather before one
// statement marks them.
const relayMarkGather = 20 * time.Millisecond

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
