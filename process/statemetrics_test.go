package process

import (
	"context"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/outbox"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// gauge returns the value of the series name{labels} in reg, and whether
// it is there.
func gauge(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetCounter().GetValue()
}

// TestStateCollector (issue 10 item 4): the gauges the alert rules use for
// the relay's backlog, open incidents, consumer lag and dead letters are
// read from the service's tables and its JetStream consumers.
func TestStateCollector(t *testing.T) {
	ctx := context.Background()
	pool, _ := testenv.SchemaPool(t, "svc", tripsql.SetSaga)
	_, _, js := testenv.JetStream(t)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(&StateCollector{Pool: pool, JS: js, Consumers: []string{"svc"}}))

	v, ok := gauge(t, reg, "tripsaga_outbox_pending", nil)
	require.True(t, ok)
	require.Zero(t, v)
	v, _ = gauge(t, reg, "tripsaga_incidents_open", map[string]string{"kind": "compensation_stuck"})
	require.Zero(t, v)
	v, _ = gauge(t, reg, "tripsaga_state_scrape_ok", nil)
	require.Equal(t, 1.0, v)

	// Two events wait in the outbox (no relay runs).
	var evs []event.Event
	for range 2 {
		e, err := events.New(events.Source("svc"), events.TripRequested, "T-metrics", map[string]string{"trip_id": "T-metrics"})
		require.NoError(t, err)
		evs = append(evs, e)
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Write(ctx, tx, evs...))
	require.NoError(t, tx.Commit(ctx))
	_, err = pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '90 seconds'`)
	require.NoError(t, err)
	v, _ = gauge(t, reg, "tripsaga_outbox_pending", nil)
	require.Equal(t, 2.0, v)
	v, _ = gauge(t, reg, "tripsaga_outbox_oldest_pending_age_seconds", nil)
	require.InDelta(t, 90, v, 30)

	// Issue 19 item 9: a transaction held open (a snapshot a forgotten
	// session keeps) is seen: the gauge is at least its age, by the
	// database's clock, at the scrape.
	open, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = open.Rollback(ctx) }()
	var began time.Time
	require.NoError(t, open.QueryRow(ctx, `SELECT now()`).Scan(&began))
	var atLeast float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXTRACT(EPOCH FROM now() - $1::timestamptz)::float8`, began).Scan(&atLeast))
	v, ok = gauge(t, reg, "tripsaga_pg_oldest_transaction_age_seconds", nil)
	require.True(t, ok)
	require.Positive(t, v)
	require.GreaterOrEqual(t, v, atLeast)
	require.NoError(t, open.Rollback(ctx))

	// One open incident, one resolved.
	_, err = pool.Exec(ctx, `INSERT INTO incidents (trip_id, step, kind, attempts, last_error, resolved_at) VALUES
		('T-1', 'hotel', 'compensation_stuck', 5, 'release: 503', NULL),
		('T-2', 'hotel', 'compensation_stuck', 5, 'release: 503', now())`)
	require.NoError(t, err)
	v, _ = gauge(t, reg, "tripsaga_incidents_open", map[string]string{"step": "hotel", "kind": "compensation_stuck"})
	require.Equal(t, 1.0, v)

	// A durable consumer with three events not yet delivered, and one
	// parked on DEADLETTER.
	_, err = js.CreateOrUpdateConsumer(ctx, events.StreamTrips, jetstream.ConsumerConfig{
		Durable: "svc", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second,
	})
	require.NoError(t, err)
	_, ok = gauge(t, reg, "tripsaga_inbox_consumer_pending", map[string]string{"consumer": "svc", "stream": events.StreamHotel})
	require.False(t, ok, "no consumer svc on HOTEL")
	for range 3 {
		_, err := js.Publish(ctx, "trip.requested.T-metrics", []byte("{}"))
		require.NoError(t, err)
	}
	_, err = js.Publish(ctx, events.DeadLetterSubjectPrefix+"."+events.StreamTrips+".svc", []byte("{}"))
	require.NoError(t, err)
	v, _ = gauge(t, reg, "tripsaga_inbox_consumer_pending", map[string]string{"consumer": "svc", "stream": events.StreamTrips})
	require.Equal(t, 3.0, v)
	v, _ = gauge(t, reg, "tripsaga_inbox_consumer_ack_pending", map[string]string{"consumer": "svc", "stream": events.StreamTrips})
	require.Zero(t, v)
	v, _ = gauge(t, reg, "tripsaga_deadletter_messages", map[string]string{"consumer": "svc", "stream": events.StreamTrips})
	require.Equal(t, 1.0, v)
	v, _ = gauge(t, reg, "tripsaga_state_scrape_ok", nil)
	require.Equal(t, 1.0, v)
}

// TestStepAndEscalationGauges (issue 22 item 7): the steps whose outcome
// is unknown and those in compensation are counted per step with the age
// of the oldest since it entered that state, stamped by the database
// (steps.status_since); open incidents carry their owner, and those older
// than the escalation limit are counted escalated.
func TestStepAndEscalationGauges(t *testing.T) {
	ctx := context.Background()
	pool, _ := testenv.SchemaPool(t, "svcsteps", tripsql.SetSaga)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(&StateCollector{Pool: pool, Owner: "payments-oncall", EscalateAfter: 10 * time.Minute}))

	for _, state := range []string{"unknown", "compensating"} {
		v, ok := gauge(t, reg, "tripsaga_steps_open", map[string]string{"state": state})
		require.True(t, ok, "exported at 0 when no step is %s", state)
		require.Zero(t, v)
	}

	insert := func(trip, status string) {
		t.Helper()
		_, err := pool.Exec(ctx, `INSERT INTO steps (trip_id, step, idempotency_key, request, fingerprint, trip, status, deadline_at)
			VALUES ($1, 'charge', $1 || ':charge', '{}', '', '{}', $2, now())`, trip, status)
		require.NoError(t, err)
	}
	insert("T-a", "done")
	insert("T-b", "unknown")
	insert("T-c", "compensating")
	insert("T-d", "compensating")
	// The trigger stamps status_since on insert and on every change of
	// status, never on other updates.
	var changed bool
	require.NoError(t, pool.QueryRow(ctx, `WITH before AS (SELECT status_since FROM steps WHERE trip_id = 'T-b')
		UPDATE steps SET attempts = attempts + 1 WHERE trip_id = 'T-b'
		RETURNING status_since <> (SELECT status_since FROM before)`).Scan(&changed))
	require.False(t, changed, "an update that keeps the status keeps status_since")
	// Age the rows (the trigger off): the oldest compensation began 20
	// minutes ago, the unknown outcome 3 minutes ago, T-a finished a day ago.
	_, err := pool.Exec(ctx, `ALTER TABLE steps DISABLE TRIGGER steps_status_since;
		UPDATE steps SET status_since = now() - interval '20 minutes' WHERE trip_id = 'T-c';
		UPDATE steps SET status_since = now() - interval '3 minutes' WHERE trip_id = 'T-b';
		UPDATE steps SET status_since = now() - interval '1 day' WHERE trip_id = 'T-a';
		ALTER TABLE steps ENABLE TRIGGER steps_status_since`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE steps SET status = 'compensating' WHERE trip_id = 'T-a'`)
	require.NoError(t, err)
	var fresh bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT status_since > now() - interval '1 minute' FROM steps WHERE trip_id = 'T-a'`).Scan(&fresh))
	require.True(t, fresh, "a change of status is stamped")

	v, _ := gauge(t, reg, "tripsaga_steps_open", map[string]string{"step": "charge", "state": "compensating"})
	require.Equal(t, 3.0, v)
	v, _ = gauge(t, reg, "tripsaga_steps_open", map[string]string{"step": "charge", "state": "unknown"})
	require.Equal(t, 1.0, v)
	v, _ = gauge(t, reg, "tripsaga_steps_oldest_open_age_seconds", map[string]string{"step": "charge", "state": "compensating"})
	require.InDelta(t, 1200, v, 60)
	v, _ = gauge(t, reg, "tripsaga_steps_oldest_open_age_seconds", map[string]string{"step": "charge", "state": "unknown"})
	require.InDelta(t, 180, v, 60)

	// Two open incidents, one raised 15 minutes ago (past the 10 minutes).
	_, err = pool.Exec(ctx, `INSERT INTO incidents (trip_id, step, kind, attempts, last_error, raised_at) VALUES
		('T-c', 'charge', 'compensation_stuck', 5, 'refund: 503', now() - interval '15 minutes'),
		('T-d', 'charge', 'compensation_stuck', 5, 'refund: 503', now())`)
	require.NoError(t, err)
	labels := map[string]string{"step": "charge", "kind": "compensation_stuck", "owner": "payments-oncall"}
	v, _ = gauge(t, reg, "tripsaga_incidents_open", labels)
	require.Equal(t, 2.0, v)
	v, _ = gauge(t, reg, "tripsaga_incidents_escalated", labels)
	require.Equal(t, 1.0, v)
}
