package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tripsaga/tripsaga/events"
)

// The gauges of [StateCollector], read at each scrape from where the data
// already is: the service's own tables (outbox, incidents, inbox_position)
// and its JetStream consumers. deploy/prometheus/alerts.yaml alerts on them.
var (
	descOutboxPending = prometheus.NewDesc("tripsaga_outbox_pending",
		"Outbox events waiting to be published (not quarantined): the relay's backlog.", nil, nil)
	descOutboxOldest = prometheus.NewDesc("tripsaga_outbox_oldest_pending_age_seconds",
		"Age of the oldest outbox event waiting to be published (0 when none waits).", nil, nil)
	descIncidentsOpen = prometheus.NewDesc("tripsaga_incidents_open",
		"Incidents raised for a person and not resolved, by step and kind.", []string{"step", "kind"}, nil)
	descConsumerPending = prometheus.NewDesc("tripsaga_inbox_consumer_pending",
		"Events of the stream the inbox's durable consumer has not been delivered yet (its lag).", []string{"consumer", "stream"}, nil)
	descConsumerAckPending = prometheus.NewDesc("tripsaga_inbox_consumer_ack_pending",
		"Events delivered to the inbox's durable consumer and not acknowledged yet.", []string{"consumer", "stream"}, nil)
	descConsumerOldest = prometheus.NewDesc("tripsaga_inbox_consumer_oldest_pending_age_seconds",
		"Age of the oldest event the inbox's durable consumer has not acknowledged yet, delivered or not (0 when none).", []string{"consumer", "stream"}, nil)
	descDeadLetters = prometheus.NewDesc("tripsaga_deadletter_messages",
		"Messages the inbox parked on DEADLETTER (deadletter.<stream>.<consumer>) still there, for a person.", []string{"consumer", "stream"}, nil)
	descStateUp = prometheus.NewDesc("tripsaga_state_scrape_ok",
		"1 when the last scrape read the service's tables and consumers, 0 when PostgreSQL or NATS did not answer.", nil, nil)
)

// incidentKinds are the kinds of the incidents table, exported at 0 when
// none is open so that a dashboard shows them.
var incidentKinds = []string{"compensation_stuck", "forward_stuck", "forward_refused"} //nolint:gochecknoglobals // read-only

// StateCollector exports what a service's own state says now: the relay's
// backlog, the open incidents, the lag of its durable consumers and its
// dead letters. It reads them at each scrape (a few small queries and
// JetStream info requests, bounded by Timeout).
type StateCollector struct {
	Pool *pgxpool.Pool
	JS   jetstream.JetStream // nil: no consumer or dead-letter gauges
	// Consumers are the durable consumer names of the service's inboxes
	// ("hotel", "trips", "reconciler"); the names in inbox_position are
	// added to them.
	Consumers []string
	Timeout   time.Duration // default 2 s
}

// ExportState registers a [StateCollector] of the process (its pool, its
// JetStream and consumer) on its registry.
func (p *Process) ExportState(consumers ...string) error {
	return p.Registry.Register(&StateCollector{Pool: p.Pool, JS: p.JS, Consumers: consumers})
}

// Describe implements prometheus.Collector.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOutboxPending, descOutboxOldest, descIncidentsOpen,
		descConsumerPending, descConsumerAckPending, descConsumerOldest, descDeadLetters, descStateUp} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := errors.Join(c.collectTables(ctx, ch), c.collectConsumers(ctx, ch))
	ok := 1.0
	if err != nil {
		ok = 0
	}
	ch <- prometheus.MustNewConstMetric(descStateUp, prometheus.GaugeValue, ok)
}

func (c *StateCollector) collectTables(ctx context.Context, ch chan<- prometheus.Metric) error {
	if c.Pool == nil {
		return nil
	}
	var pending int64
	var oldest float64
	err := c.Pool.QueryRow(ctx, `SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
		FROM outbox WHERE published_at IS NULL AND quarantined_at IS NULL`).Scan(&pending, &oldest)
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	ch <- prometheus.MustNewConstMetric(descOutboxPending, prometheus.GaugeValue, float64(pending))
	ch <- prometheus.MustNewConstMetric(descOutboxOldest, prometheus.GaugeValue, max(oldest, 0))

	rows, err := c.Pool.Query(ctx, `SELECT step, kind, count(*) FROM incidents WHERE resolved_at IS NULL GROUP BY step, kind`)
	if err != nil {
		return fmt.Errorf("incidents: %w", err)
	}
	defer rows.Close()
	type sk struct{ step, kind string }
	open := map[sk]int64{}
	for rows.Next() {
		var k sk
		var n int64
		if err := rows.Scan(&k.step, &k.kind, &n); err != nil {
			return fmt.Errorf("incidents: %w", err)
		}
		open[k] = n
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("incidents: %w", err)
	}
	for k, n := range open {
		ch <- prometheus.MustNewConstMetric(descIncidentsOpen, prometheus.GaugeValue, float64(n), k.step, k.kind)
	}
	if len(open) == 0 {
		for _, kind := range incidentKinds {
			ch <- prometheus.MustNewConstMetric(descIncidentsOpen, prometheus.GaugeValue, 0, "", kind)
		}
	}
	return nil
}

func (c *StateCollector) collectConsumers(ctx context.Context, ch chan<- prometheus.Metric) error {
	if c.JS == nil {
		return nil
	}
	names := slices.Clone(c.Consumers)
	if c.Pool != nil {
		rows, err := c.Pool.Query(ctx, `SELECT DISTINCT consumer FROM inbox_position`)
		if err == nil {
			for rows.Next() {
				var n string
				if rows.Scan(&n) == nil && !slices.Contains(names, n) {
					names = append(names, n)
				}
			}
			rows.Close()
		}
	}
	var errs []error
	streams := events.Selected().StreamSubjects()
	var dead map[string]uint64
	deadOK := false
	if len(names) > 0 {
		if s, err := c.JS.Stream(ctx, events.StreamDeadLetter); err == nil {
			info, err := s.Info(ctx, jetstream.WithSubjectFilter(events.DeadLetterSubjectPrefix+".>"))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", events.StreamDeadLetter, err))
			} else {
				dead, deadOK = info.State.Subjects, true
			}
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, fmt.Errorf("%s: %w", events.StreamDeadLetter, err))
		}
	}
	for stream := range streams {
		for _, name := range names {
			cons, err := c.JS.Consumer(ctx, stream, name)
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("consumer %s on %s: %w", name, stream, err))
				continue
			}
			info := cons.CachedInfo()
			ch <- prometheus.MustNewConstMetric(descConsumerPending, prometheus.GaugeValue, float64(info.NumPending), name, stream)
			ch <- prometheus.MustNewConstMetric(descConsumerAckPending, prometheus.GaugeValue, float64(info.NumAckPending), name, stream)
			ch <- prometheus.MustNewConstMetric(descConsumerOldest, prometheus.GaugeValue, c.oldestPendingAge(ctx, info), name, stream)
			if deadOK {
				subject := events.DeadLetterSubjectPrefix + "." + stream + "." + name
				ch <- prometheus.MustNewConstMetric(descDeadLetters, prometheus.GaugeValue, float64(dead[subject]), name, stream)
			}
		}
	}
	return errors.Join(errs...)
}

// oldestPendingAge is the age in seconds of the first event after the
// consumer's ack floor that its filters select: the oldest one it has not
// acknowledged. 0 when nothing is pending or the event cannot be read.
func (c *StateCollector) oldestPendingAge(ctx context.Context, info *jetstream.ConsumerInfo) float64 {
	if info.NumPending+uint64(info.NumAckPending) == 0 {
		return 0
	}
	s, err := c.JS.Stream(ctx, info.Stream)
	if err != nil {
		return 0
	}
	filters := info.Config.FilterSubjects
	if info.Config.FilterSubject != "" {
		filters = append(filters, info.Config.FilterSubject)
	}
	if len(filters) == 0 {
		filters = []string{">"}
	}
	var oldest time.Time
	for _, f := range filters {
		m, err := s.GetMsg(ctx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(f))
		if err == nil && (oldest.IsZero() || m.Time.Before(oldest)) {
			oldest = m.Time
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return max(time.Since(oldest).Seconds(), 0)
}
