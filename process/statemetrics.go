package process

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
	descOutboxPending = prometheus.NewDesc("tripsaga_outbox_pending", //nolint:gochecknoglobals // read-only declaration
		"Outbox events waiting to be published (not quarantined): the relay's backlog.", nil, nil)
	descOutboxOldest = prometheus.NewDesc("tripsaga_outbox_oldest_pending_age_seconds", //nolint:gochecknoglobals // read-only declaration
		"Age of the oldest outbox event waiting to be published (0 when none waits).", nil, nil)
	descOldestTx = prometheus.NewDesc("tripsaga_pg_oldest_transaction_age_seconds", //nolint:gochecknoglobals // read-only declaration
		"Age of the oldest open transaction in the service's database that its role can see in pg_stat_activity (all of them with pg_read_all_stats), 0 when none: a snapshot held open keeps the row versions the relay's claim reads must step over.", nil, nil)
	descIncidentsOpen = prometheus.NewDesc("tripsaga_incidents_open", //nolint:gochecknoglobals // read-only declaration
		"Incidents raised for a person and not resolved, by step and kind, with who owns them (INCIDENT_OWNER).", []string{"step", "kind", "owner"}, nil)
	descIncidentsEscalated = prometheus.NewDesc("tripsaga_incidents_escalated", //nolint:gochecknoglobals // read-only declaration
		"Open incidents older than INCIDENT_ESCALATE_AFTER_MS (default 30 minutes): escalated past their owner.", []string{"step", "kind", "owner"}, nil)
	descStepsOpen = prometheus.NewDesc("tripsaga_steps_open", //nolint:gochecknoglobals // read-only declaration
		"Steps whose outcome is unknown (state=unknown: asked again by key until the deadline) or whose undo is under way (state=compensating), by step.", []string{"step", "state"}, nil)
	descStepsOldest = prometheus.NewDesc("tripsaga_steps_oldest_open_age_seconds", //nolint:gochecknoglobals // read-only declaration
		"Age of the oldest step in that state, since it entered it (the database's clock; 0 when none).", []string{"step", "state"}, nil)
	descConsumerPending = prometheus.NewDesc("tripsaga_inbox_consumer_pending", //nolint:gochecknoglobals // read-only declaration
		"Events of the stream the inbox's durable consumer has not been delivered yet (its lag).", []string{"consumer", "stream"}, nil)
	descConsumerAckPending = prometheus.NewDesc("tripsaga_inbox_consumer_ack_pending", //nolint:gochecknoglobals // read-only declaration
		"Events delivered to the inbox's durable consumer and not acknowledged yet.", []string{"consumer", "stream"}, nil)
	descConsumerOldest = prometheus.NewDesc("tripsaga_inbox_consumer_oldest_pending_age_seconds", //nolint:gochecknoglobals // read-only declaration
		"Age of the oldest event the inbox's durable consumer has not acknowledged yet, delivered or not (0 when none).", []string{"consumer", "stream"}, nil)
	descDeadLetters = prometheus.NewDesc("tripsaga_deadletter_messages", //nolint:gochecknoglobals // read-only declaration
		"Messages the inbox parked on DEADLETTER (deadletter.<stream>.<consumer>) still there, for a person.", []string{"consumer", "stream"}, nil)
	descStateUp = prometheus.NewDesc("tripsaga_state_scrape_ok", //nolint:gochecknoglobals // read-only declaration
		"1 when the last scrape read the service's tables and consumers, 0 when PostgreSQL or NATS did not answer.", nil, nil)
)

// incidentKinds are the kinds of the incidents table, exported at 0 when
// none is open so that a dashboard shows them.
var incidentKinds = []string{"compensation_stuck", "forward_stuck", "forward_refused"} //nolint:gochecknoglobals // read-only

// openStates are the step states the step gauges count, exported at 0
// when no step is in them.
var openStates = []string{"unknown", "compensating"} //nolint:gochecknoglobals // read-only

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
	// Owner labels the incident gauges (INCIDENT_OWNER, see [Env.Owner]);
	// an open incident older than EscalateAfter is counted escalated.
	Owner         string
	EscalateAfter time.Duration
	// Catalogue gives the streams whose consumers are gauged (zero:
	// events.Default).
	Catalogue events.Catalogue
}

// ExportState registers a [StateCollector] of the process (its pool, its
// JetStream and consumer) on its registry.
func (p *Process) ExportState(consumers ...string) error {
	return p.Registry.Register(&StateCollector{Pool: p.Pool, JS: p.JS, Consumers: consumers,
		Owner: p.Env.Owner(p.Name), EscalateAfter: p.Env.EscalateAfter(), Catalogue: p.Env.Steps()})
}

// Describe implements prometheus.Collector.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOutboxPending, descOutboxOldest, descOldestTx, descIncidentsOpen, descIncidentsEscalated,
		descStepsOpen, descStepsOldest, descConsumerPending, descConsumerAckPending, descConsumerOldest, descDeadLetters, descStateUp} {
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

	// Another session's xact_start is NULL to a role without
	// pg_read_all_stats (PostgreSQL docs, "The Cumulative Statistics
	// System", pg_stat_activity): then only the role's own count.
	var oldestTx float64
	if err := c.Pool.QueryRow(ctx, `SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(xact_start)), 0)::float8
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`).Scan(&oldestTx); err != nil {
		return fmt.Errorf("oldest transaction: %w", err)
	}
	ch <- prometheus.MustNewConstMetric(descOldestTx, prometheus.GaugeValue, max(oldestTx, 0))

	escalate := c.EscalateAfter
	if escalate <= 0 {
		escalate = DefaultIncidentEscalateAfter
	}
	rows, err := c.Pool.Query(ctx, `SELECT step, kind, count(*),
			count(*) FILTER (WHERE raised_at + $1::bigint * interval '1 millisecond' <= now())
		FROM incidents WHERE resolved_at IS NULL GROUP BY step, kind`, escalate.Milliseconds())
	if err != nil {
		return fmt.Errorf("incidents: %w", err)
	}
	defer rows.Close()
	type sk struct{ step, kind string }
	open, escalated := map[sk]int64{}, map[sk]int64{}
	for rows.Next() {
		var k sk
		var n, e int64
		if err := rows.Scan(&k.step, &k.kind, &n, &e); err != nil {
			return fmt.Errorf("incidents: %w", err)
		}
		open[k], escalated[k] = n, e
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("incidents: %w", err)
	}
	for k, n := range open {
		ch <- prometheus.MustNewConstMetric(descIncidentsOpen, prometheus.GaugeValue, float64(n), k.step, k.kind, c.Owner)
		ch <- prometheus.MustNewConstMetric(descIncidentsEscalated, prometheus.GaugeValue, float64(escalated[k]), k.step, k.kind, c.Owner)
	}
	if len(open) == 0 {
		for _, kind := range incidentKinds {
			ch <- prometheus.MustNewConstMetric(descIncidentsOpen, prometheus.GaugeValue, 0, "", kind, c.Owner)
			ch <- prometheus.MustNewConstMetric(descIncidentsEscalated, prometheus.GaugeValue, 0, "", kind, c.Owner)
		}
	}
	rows.Close()
	return c.collectSteps(ctx, ch)
}

// collectSteps exports the steps in an unknown outcome and in
// compensation, and the age of the oldest of each, per step (from
// steps.status_since; a schema without a step log exports none).
func (c *StateCollector) collectSteps(ctx context.Context, ch chan<- prometheus.Metric) error {
	var hasSteps bool
	if err := c.Pool.QueryRow(ctx, `SELECT to_regclass('steps') IS NOT NULL`).Scan(&hasSteps); err != nil {
		return fmt.Errorf("steps: %w", err)
	}
	if !hasSteps {
		return nil
	}
	rows, err := c.Pool.Query(ctx, `SELECT step, status, count(*), EXTRACT(EPOCH FROM now() - min(status_since))::float8
		FROM steps WHERE status = ANY($1) GROUP BY step, status`, openStates)
	if err != nil {
		return fmt.Errorf("steps: %w", err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	for rows.Next() {
		var step, state string
		var n int64
		var age float64
		if err := rows.Scan(&step, &state, &n, &age); err != nil {
			return fmt.Errorf("steps: %w", err)
		}
		seen[state] = true
		ch <- prometheus.MustNewConstMetric(descStepsOpen, prometheus.GaugeValue, float64(n), step, state)
		ch <- prometheus.MustNewConstMetric(descStepsOldest, prometheus.GaugeValue, max(age, 0), step, state)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("steps: %w", err)
	}
	for _, state := range openStates {
		if !seen[state] {
			ch <- prometheus.MustNewConstMetric(descStepsOpen, prometheus.GaugeValue, 0, "", state)
			ch <- prometheus.MustNewConstMetric(descStepsOldest, prometheus.GaugeValue, 0, "", state)
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
	streams := Env{Catalogue: c.Catalogue}.Steps().StreamSubjects()
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
