package bench

import (
	"context"
	"fmt"
	"github.com/tripsaga/tripsaga/natsauth"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// sagaStepSchema is baseline A's scratch schema: an inbox, a step table and
// an outbox shaped like the saga set's.
const sagaStepSchema = `
DROP SCHEMA IF EXISTS bench_step CASCADE;
CREATE SCHEMA bench_step;
CREATE TABLE bench_step.inbox (
    consumer text NOT NULL, source text NOT NULL, event_id text NOT NULL,
    ce_type text NOT NULL, stream text NOT NULL, stream_seq bigint NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, source, event_id));
CREATE TABLE bench_step.steps (
    id int PRIMARY KEY, status text NOT NULL, attempts int NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO bench_step.steps (id, status) SELECT g, 'new' FROM generate_series(1, 10000) g;
CREATE TABLE bench_step.outbox (
    id bigserial PRIMARY KEY, event_id text NOT NULL UNIQUE, nats_subject text NOT NULL,
    headers jsonb NOT NULL, data bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz, attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON bench_step.outbox (next_attempt_at, id) WHERE published_at IS NULL;`

// sagaStepTPS is baseline A: transactions per second of conns connections
// each running, for d, the shape of one saga step: an inbox insert, a row
// update and an outbox insert, one statement at a time, then commit.
func sagaStepTPS(ctx context.Context, databaseURL string, conns int, d time.Duration) (float64, error) {
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return 0, fmt.Errorf("bench: baseline A: %w", err)
	}
	pcfg.MaxConns, pcfg.MinConns = int32(conns), int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return 0, fmt.Errorf("bench: baseline A: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, sagaStepSchema); err != nil {
		return 0, fmt.Errorf("bench: baseline A: schema: %w", err)
	}
	headers := `{"ce-id":"x","ce-source":"/tripsaga/bench","ce-specversion":"1.0","ce-type":"io.tripsaga.hotel.held.v1","ce-subject":"T-1","ce-time":"2026-01-01T00:00:00Z","ce-datacontenttype":"application/json"}`
	data := []byte(`{"trip_id":"T-1","step":"hotel","idempotency_key":"T-1:hotel","answer":"` + strings.Repeat("x", 200) + `"}`)
	var n atomic.Int64
	var firstErr error
	var once sync.Once
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range conns {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7)) //nolint:gosec // a benchmark's workload, not a secret
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				id := fmt.Sprintf("%d-%d-%d", start.UnixNano(), w, i)
				err := func() error {
					tx, err := pool.Begin(ctx)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback(ctx) }()
					if _, err := tx.Exec(ctx, `INSERT INTO bench_step.inbox (consumer, source, event_id, ce_type, stream, stream_seq) VALUES ('hotel', '/tripsaga/trips', $1, 'io.tripsaga.trip.requested.v1', 'TRIPS', $2)`, id, int64(i)); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, `UPDATE bench_step.steps SET status = 'held', attempts = attempts + 1, updated_at = now() WHERE id = $1`, 1+rng.IntN(10000)); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, `INSERT INTO bench_step.outbox (event_id, nats_subject, headers, data) VALUES ($1, 'hotel.held.T-1', $2, $3)`, id, headers, data); err != nil {
						return err
					}
					return tx.Commit(ctx)
				}()
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	if firstErr != nil {
		return 0, fmt.Errorf("bench: baseline A: %w", firstErr)
	}
	_, _ = pool.Exec(ctx, `DROP SCHEMA bench_step CASCADE`)
	return float64(n.Load()) / el.Seconds(), nil
}

// jsPublishPerS is baseline B: asynchronous publishes of size-byte messages
// per second to a scratch file stream (BENCH_B) on natsURL for d, counted
// by PubAcks received, as natsauth.Admin (its seed file creds); the stream
// is deleted afterwards.
func jsPublishPerS(ctx context.Context, natsURL, creds string, size int, d time.Duration) (float64, error) {
	opts, err := natsauth.Client{Creds: creds}.Options(natsauth.Admin)
	if err != nil {
		return 0, fmt.Errorf("bench: baseline B: %w", err)
	}
	nc, err := nats.Connect(natsURL, opts...)
	if err != nil {
		return 0, fmt.Errorf("bench: baseline B: %w", err)
	}
	defer nc.Close()
	var acked, failed atomic.Int64
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(4000),
		jetstream.WithPublishAsyncAckHandler(func(jetstream.JetStream, *nats.Msg, *jetstream.PubAck) { acked.Add(1) }),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { failed.Add(1) }))
	if err != nil {
		return 0, fmt.Errorf("bench: baseline B: %w", err)
	}
	const stream = "BENCH_B"
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{"bench.b.>"}, Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy,
	}); err != nil {
		return 0, fmt.Errorf("bench: baseline B: stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), stream) }()
	payload := []byte(strings.Repeat("x", size))
	start := time.Now()
	deadline := start.Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := js.PublishAsync("bench.b.x", payload); err != nil {
			// Too many outstanding: wait for acks.
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Second):
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		return 0, fmt.Errorf("bench: baseline B: PubAcks missing after 30 s")
	}
	el := time.Since(start)
	if f := failed.Load(); f > 0 {
		return 0, fmt.Errorf("bench: baseline B: %d publishes failed", f)
	}
	return float64(acked.Load()) / el.Seconds(), nil
}
