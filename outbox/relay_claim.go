package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/internal/tracing"
	"github.com/tripsaga/tripsaga/outbox/internal/dbsqlc"
)

// parentOfHeaders is the span context of an outbox row's event: its
// ce-traceparent and ce-tracestate headers.
func parentOfHeaders(h map[string]string) trace.SpanContext {
	tp, ts := events.TraceContextOfHeaders(h)
	if tp == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(tracing.WithParent(context.Background(), tp, ts))
}

// relayBackoffMin is a failed row's first backoff; it doubles per failure
// up to RelayConfig.BackoffMax.
const relayBackoffMin = 100 * time.Millisecond

// errNoPubAck is a publish whose PubAck did not come before AckTimeout.
var errNoPubAck = errors.New("outbox: no PubAck before AckTimeout")

// PublishBatch claims up to BatchSize due rows in one transaction,
// publishes them asynchronously, waits for their PubAcks (at most
// AckTimeout) and, in that transaction, marks every acked row published
// with one statement (a duplicate PubAck is success), whatever happened to
// the others. A row the server refused for what it is ([CauseRefused])
// gets a backoff and is quarantined after MaxAttempts refusals; a row that
// failed for the server's state (an outage: storage, limits, no stream, no
// leader, timeout, no connection) gets a backoff and is never counted
// towards quarantine. It returns how many rows it claimed, and an error
// naming the causes when rows failed for an outage (rows were still marked)
// or when the batch itself failed (nothing marked; the next batch
// re-publishes and the duplicate window drops what got through).
func (r *Relay) PublishBatch(ctx context.Context) (int, error) {
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := queries.OutboxClaimBatch(ctx, tx, int32(r.cfg.BatchSize))
	if err != nil {
		return 0, fmt.Errorf("claim: %w", err)
	}
	if len(rows) == 0 {
		return 0, nil
	}
	type pending struct {
		row  dbsqlc.OutboxClaimBatchRow
		f    jetstream.PubAckFuture
		ack  *jetstream.PubAck
		err  error
		span trace.Span
	}
	ps := make([]pending, len(rows))
	for i, row := range rows {
		ps[i].row = row
		var h map[string]string
		if err := json.Unmarshal(row.Headers, &h); err != nil {
			ps[i].err = fmt.Errorf("%w: headers: %w", errBadRow, err)
			continue
		}
		msg := &nats.Msg{Subject: row.NatsSubject, Data: row.Data, Header: nats.Header{}}
		for k, v := range h {
			msg.Header[k] = []string{v}
		}
		if tracing.Enabled() {
			ps[i].span = startPublish(parentOfHeaders(h), row.EventID, row.NatsSubject, "batch")
		}
		ps[i].f, ps[i].err = r.cfg.JetStream.PublishMsgAsync(msg, jetstream.WithMsgID(row.EventID))
	}
	if tracing.Enabled() {
		defer func() {
			for i := range ps {
				if ps[i].span != nil {
					tracing.End(ps[i].span, ps[i].err)
				}
			}
		}()
	}
	deadline := time.NewTimer(r.cfg.AckTimeout)
	defer deadline.Stop()
	expired := false
	for i := range ps {
		p := &ps[i]
		if p.err != nil {
			continue
		}
		if !expired {
			select {
			case p.ack = <-p.f.Ok():
				continue
			case err := <-p.f.Err():
				p.err = err
				continue
			case <-deadline.C:
				expired = true
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		// Past the deadline: take what has arrived, the rest timed out.
		select {
		case p.ack = <-p.f.Ok():
		case err := <-p.f.Err():
			p.err = err
		default:
			p.err = errNoPubAck
		}
	}
	var ok dbsqlc.OutboxMarkPublishedParams
	var outage dbsqlc.OutboxMarkOutageParams
	outages := map[Cause]int{}
	var refused []*pending
	for i := range ps {
		p := &ps[i]
		if p.err == nil {
			ok.Ids = append(ok.Ids, p.row.ID)
			ok.Streams = append(ok.Streams, p.ack.Stream)
			ok.Seqs = append(ok.Seqs, int64(p.ack.Sequence))
			continue
		}
		c := Classify(p.err)
		r.m.failures.WithLabelValues(string(c)).Inc()
		if !c.Outage() {
			refused = append(refused, p)
			continue
		}
		outages[c]++
		outage.Ids = append(outage.Ids, p.row.ID)
		outage.Causes = append(outage.Causes, string(c))
		outage.Errors = append(outage.Errors, p.err.Error())
	}
	if err := fault.HitAny(ctx, fault.At(r.service(), "relay", fault.AfterPublish), len(ps), func(i int) string { return fault.TripOfSubject(ps[i].row.NatsSubject) }); err != nil {
		return 0, err
	}
	if len(ok.Ids) > 0 {
		if err := queries.OutboxMarkPublished(ctx, tx, ok); err != nil {
			return 0, fmt.Errorf("mark published: %w", err)
		}
	}
	if len(outage.Ids) > 0 {
		outage.BackoffMinSeconds = relayBackoffMin.Seconds()
		outage.BackoffMaxSeconds = r.cfg.BackoffMax.Seconds()
		if err := queries.OutboxMarkOutage(ctx, tx, outage); err != nil {
			return 0, fmt.Errorf("mark outage: %w", err)
		}
	}
	quarantined := 0
	for _, p := range refused {
		backoff := math.Min(relayBackoffMin.Seconds()*math.Pow(2, float64(p.row.Attempts)), r.cfg.BackoffMax.Seconds())
		q, err := queries.OutboxMarkRefused(ctx, tx, dbsqlc.OutboxMarkRefusedParams{
			ID: p.row.ID, LastError: new(p.err.Error()), BackoffSeconds: backoff, MaxAttempts: int32(r.cfg.MaxAttempts),
		})
		if err != nil {
			return 0, fmt.Errorf("mark refused: %w", err)
		}
		if q {
			quarantined++
			r.cfg.Logger.Error("outbox event quarantined: the server refused it MaxAttempts times; re-drive it with `tripsaga outbox redrive` once the cause is fixed",
				"event_id", p.row.EventID, "subject", p.row.NatsSubject, "attempts", p.row.Attempts+1, "err", p.err)
		} else {
			r.cfg.Logger.Warn("outbox event refused by the server; will retry", "event_id", p.row.EventID, "subject", p.row.NatsSubject, "attempt", p.row.Attempts+1, "err", p.err, "backoff_s", backoff)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// A failed COMMIT may have committed: rows are re-read next time and
		// a re-publish is dropped by the duplicate window.
		return 0, fmt.Errorf("commit: %w", err)
	}
	r.m.published.Add(float64(len(ok.Ids)))
	r.m.quarantined.Add(float64(quarantined))
	if len(outages) > 0 {
		var errs []error
		for _, c := range slices.Sorted(maps.Keys(outages)) {
			for _, p := range ps {
				if p.err != nil && Classify(p.err) == c {
					errs = append(errs, &OutageError{Cause: c, Events: outages[c], Err: p.err})
					break
				}
			}
		}
		return len(rows), errors.Join(errs...)
	}
	return len(rows), nil
}

// OutageError is returned by [Relay.PublishBatch] when Events rows of the
// batch could not be published for an outage of cause Cause (Err is the
// first such row's error). Those rows wait with a backoff; the others of
// the batch were handled.
type OutageError struct {
	Cause  Cause
	Events int
	Err    error
}

func (e *OutageError) Error() string {
	return fmt.Sprintf("outbox: %d events not published (outage: %s): %v", e.Events, e.Cause, e.Err)
}

func (e *OutageError) Unwrap() error { return e.Err }
