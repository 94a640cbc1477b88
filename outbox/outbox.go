// Package outbox is the transactional outbox of every service.
//
// [Write] stores outgoing CloudEvents in the same pgx transaction as the
// state change they report. A [Relay] publishes stored events to JetStream
// with Nats-Msg-Id = event id and marks them published only after the
// PubAck, so a crash between publish and mark re-publishes and JetStream's
// duplicate window (events.DuplicateWindow) drops the copy. Its other half,
// the consumer that records each event it handles in the handler's own
// transaction, is package inbox.
//
// Tables are unqualified: each service's pool sets search_path to its own
// schema (see the sql package).
package outbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/tracing"
	"github.com/tripsaga/tripsaga/outbox/internal/dbsqlc"
)

var queries = dbsqlc.New() //nolint:gochecknoglobals // stateless

// Write stores evs in the outbox inside tx, to be published when tx commits.
// When ctx comes from [WithAfterCommit] with a running relay, that relay
// publishes them right after the commit (their rows are left to the other
// relays' claims for RelayConfig.LocalGrace); otherwise Write wakes the
// relays (pg_notify is delivered at commit). Each event must
// be valid (CloudEvents required attributes), of a type with a kind
// (events.Kind) whose NATS subject a stream holds (of the
// RelayConfig.Catalogue of ctx's relay, [WithAfterCommit] or
// [UnitOfWork.InTx], running or not; else of events.Full(), the trip's;
// see [Relay.Write] for a saga of its own), and have the saga's id as
// subject; otherwise Write returns an error wrapping
// events.ErrInvalidEvent and the caller should roll back (JetStream would
// refuse an event no stream holds, and it would never be published).
//
// With tracing on (internal/tracing), Write is a span of its own (a child
// of ctx's) and each event that carries no traceparent yet is stored with
// that span's trace context (the CloudEvents distributed-tracing extension,
// ce-traceparent and ce-tracestate), so its consumers' spans join the trace.
func Write(ctx context.Context, tx pgx.Tx, evs ...event.Event) error {
	streams := events.Full()
	if r := ctxRelay(ctx); r != nil {
		streams = r.cfg.Catalogue // the saga's own, even before its relay runs
	}
	return write(ctx, tx, localRelay(ctx), streams, evs)
}

// Write is [Write] checked against the relay's own streams
// (RelayConfig.Catalogue) whatever ctx holds: a saga other than the trip
// writes its events with its relay.
func (r *Relay) Write(ctx context.Context, tx pgx.Tx, evs ...event.Event) error {
	return write(ctx, tx, localRelay(ctx), r.cfg.Catalogue, evs)
}

// write stores evs in tx's outbox, each checked against the streams of
// catalogue streams; relay, when not nil, publishes them after commit.
func write(ctx context.Context, tx pgx.Tx, relay *Relay, streams events.Catalogue, evs []event.Event) (err error) {
	if len(evs) > 0 && tracing.Enabled() {
		var span trace.Span
		ctx, span = startWrite(ctx, evs)
		defer func() { tracing.End(span, err) }()
	}
	var delay float64
	var local []localEvent
	if relay != nil {
		delay = relay.cfg.LocalGrace.Seconds()
		local = make([]localEvent, 0, len(evs))
	}
	for _, e := range evs {
		if tracing.Enabled() {
			e = e.Clone() // the caller's event stays as it was
			tracing.Inject(ctx, &e)
		}
		subject, err := events.Subject(e.Type(), e.Subject())
		if err != nil {
			return fmt.Errorf("outbox: event %s: %w", e.ID(), err)
		}
		// Any version's streams (the trip's events.Full), not only this
		// process's STEPS: an optional step's service goes on finishing
		// the sagas of a version with it after STEPS turned it off.
		if _, ok := streams.StreamOf(subject); !ok {
			return fmt.Errorf("outbox: event %s: %w: no stream of the catalogue holds subject %q", e.ID(), events.ErrInvalidEvent, subject)
		}
		h, err := events.EncodeHeaders(e)
		if err != nil {
			return fmt.Errorf("outbox: event %s: %w", e.ID(), err)
		}
		hj, err := json.Marshal(h)
		if err != nil {
			return fmt.Errorf("outbox: event %s: %w", e.ID(), err)
		}
		if err := queries.OutboxInsert(ctx, Later(tx), dbsqlc.OutboxInsertParams{
			EventID:      e.ID(),
			NatsSubject:  subject,
			Headers:      hj,
			Data:         e.Data(),
			DelaySeconds: delay,
		}); err != nil {
			return fmt.Errorf("outbox: insert %s: %w", e.ID(), err)
		}
		if relay != nil {
			local = append(local, localEvent{id: e.ID(), subject: subject, headers: h, data: e.Data(), trace: trace.SpanContextFromContext(ctx)})
		}
	}
	if len(evs) == 0 {
		return nil
	}
	if relay != nil {
		AfterCommit(ctx, func() { relay.publishLocal(local) })
		return nil
	}
	if err := queries.OutboxNotify(ctx, Later(tx)); err != nil {
		return fmt.Errorf("outbox: notify: %w", err)
	}
	return nil
}

// startWrite starts the span of a Write of evs: "outbox write <type>"
// (kind producer), in the caller's transaction.
func startWrite(ctx context.Context, evs []event.Event) (context.Context, trace.Span) {
	first := evs[0]
	attrs := append(tracing.EventAttrs(first),
		attribute.String("messaging.operation.type", "create"),
		attribute.Int("messaging.batch.message_count", len(evs)))
	return tracing.Start(ctx, "outbox write "+first.Type(), trace.SpanKindProducer, attrs...)
}

// Pending returns how many events wait to be published (not quarantined).
func Pending(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
	return queries.OutboxCountPending(ctx, db)
}
