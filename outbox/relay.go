package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/outbox/internal/dbsqlc"
)

// Relay defaults.
const (
	RelayBatchSizeDefault    = 200
	RelayPollIntervalDefault = time.Second
	RelayMaxAttemptsDefault  = 50
	RelayBackoffMaxDefault   = 20 * time.Second
	RelayAckTimeoutDefault   = 10 * time.Second
	RelayRetentionDefault    = 24 * time.Hour
)

// ErrInvalidConfig is wrapped by constructors given a bad Config.
var ErrInvalidConfig = errors.New("outbox: invalid config")

// RelayConfig configures a [Relay].
type RelayConfig struct {
	// Pool reaches the service's schema (search_path set). Required.
	Pool *pgxpool.Pool
	// JetStream publishes. Required.
	JetStream jetstream.JetStream
	// BatchSize is how many rows one transaction claims and publishes
	// asynchronously. Defaults to 200.
	BatchSize int
	// PollInterval is how often the relay looks for rows when no NOTIFY
	// woke it (a NOTIFY can be lost on reconnect). Defaults to 1 s.
	PollInterval time.Duration
	// MaxAttempts is how many refusals of one row by the server quarantine
	// it, so it is counted for a person instead of retried forever.
	// Outages (no connection, no PubAck in time) never count. Defaults to 50.
	MaxAttempts int
	// BackoffMax caps the per-row retry backoff (100 ms doubling). It must
	// stay well inside events.DuplicateWindow so that a re-publish is still
	// deduplicated. Defaults to 20 s.
	BackoffMax time.Duration
	// AckTimeout bounds the wait for a batch's PubAcks. Defaults to 10 s.
	AckTimeout time.Duration
	// Retention is how long published rows are kept (for inspection)
	// before the relay deletes them, hourly. Defaults to 24 h. Events stay
	// in the streams for events.MaxAge.
	Retention time.Duration
	// Logger defaults to a discard logger.
	Logger *slog.Logger
	// Registerer, when set, receives the relay's Prometheus metrics.
	Registerer prometheus.Registerer

	// beforeMark, in tests, runs after publishing and before marking rows;
	// an error aborts the transaction as a crash there would.
	beforeMark func() error
}

func (c *RelayConfig) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = RelayBatchSizeDefault
	}
	if c.PollInterval == 0 {
		c.PollInterval = RelayPollIntervalDefault
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = RelayMaxAttemptsDefault
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = RelayBackoffMaxDefault
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = RelayAckTimeoutDefault
	}
	if c.Retention == 0 {
		c.Retention = RelayRetentionDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c *RelayConfig) validate() error {
	switch {
	case c.Pool == nil:
		return fmt.Errorf("%w: Pool is required", ErrInvalidConfig)
	case c.JetStream == nil:
		return fmt.Errorf("%w: JetStream is required", ErrInvalidConfig)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return fmt.Errorf("%w: BatchSize %d not in 1..10000", ErrInvalidConfig, c.BatchSize)
	case c.BackoffMax >= events.DuplicateWindow/2:
		return fmt.Errorf("%w: BackoffMax %s must stay well inside the %s duplicate window", ErrInvalidConfig, c.BackoffMax, events.DuplicateWindow)
	}
	return nil
}

// Relay publishes a service's outbox to JetStream. Several relays may run
// on one schema at once: rows are claimed with FOR UPDATE SKIP LOCKED, so
// they may publish one trip's events out of order; consumers do not depend
// on order. Rows are claimed by status, never by an id watermark, so a row
// whose transaction commits late is published when it becomes visible.
type Relay struct {
	cfg     RelayConfig
	wake    chan struct{}
	channel string
	m       relayMetrics
}

type relayMetrics struct {
	published, failed, quarantined prometheus.Counter
}

// NewRelay returns a relay. It returns an error wrapping [ErrInvalidConfig]
// for a bad cfg.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, wake: make(chan struct{}, 1)}
	r.m = relayMetrics{
		published:   prometheus.NewCounter(prometheus.CounterOpts{Name: "tripsaga_outbox_published_total", Help: "Outbox events published and acked by JetStream."}),
		failed:      prometheus.NewCounter(prometheus.CounterOpts{Name: "tripsaga_outbox_publish_failures_total", Help: "Failed publish attempts of outbox events."}),
		quarantined: prometheus.NewCounter(prometheus.CounterOpts{Name: "tripsaga_outbox_quarantined_total", Help: "Outbox events quarantined after MaxAttempts failures."}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.m.published, r.m.failed, r.m.quarantined} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("outbox: metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Wake makes the relay look for rows now (in-process shortcut for NOTIFY).
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run publishes until ctx ends. It listens for NOTIFY on
// "outbox_<schema>" and also polls every PollInterval.
func (r *Relay) Run(ctx context.Context) error {
	schema, err := queries.OutboxCurrentSchema(ctx, r.cfg.Pool)
	if err != nil {
		return fmt.Errorf("outbox: relay: %w", err)
	}
	r.channel = "outbox_" + schema
	go r.listen(ctx)
	t := time.NewTicker(r.cfg.PollInterval)
	defer t.Stop()
	clean := time.NewTicker(time.Hour)
	defer clean.Stop()
	for {
		for {
			n, err := r.PublishBatch(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				r.cfg.Logger.Warn("outbox relay batch failed", "err", err)
				break
			}
			if n < r.cfg.BatchSize {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-r.wake:
		case <-clean.C:
			n, err := queries.OutboxDeletePublishedBefore(ctx, r.cfg.Pool, time.Now().Add(-r.cfg.Retention))
			if err != nil {
				r.cfg.Logger.Warn("outbox cleanup failed", "err", err)
			} else if n > 0 {
				r.cfg.Logger.Info("outbox cleanup", "deleted", n)
			}
		}
	}
}

func (r *Relay) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Warn("outbox relay LISTEN lost; polling meanwhile", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	conn, err := r.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(r.channel)); err != nil {
		return err
	}
	defer func() {
		// Leave the pooled connection clean.
		_, _ = conn.Exec(context.Background(), "UNLISTEN *")
	}()
	r.Wake() // rows written while we were not listening
	for {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			return err
		}
		r.Wake()
	}
}

// rowError reports whether err is the server refusing this message (a
// JetStream API error, e.g. too large), as opposed to an outage.
func rowError(err error) bool {
	var api *jetstream.APIError
	var napi *nats.APIError
	return errors.As(err, &api) || errors.As(err, &napi) || errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject)
}

func quoteIdent(s string) string {
	out := []byte{'"'}
	for i := 0; i < len(s); i++ {
		if s[i] == '"' {
			out = append(out, '"')
		}
		out = append(out, s[i])
	}
	return string(append(out, '"'))
}

// PublishBatch claims up to BatchSize due rows in one transaction,
// publishes them asynchronously, waits for their PubAcks and marks the
// acked ones published (a duplicate PubAck is success); failed rows get a
// backoff, and are quarantined after MaxAttempts. It returns how many rows
// it claimed.
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
		row dbsqlc.OutboxClaimBatchRow
		f   jetstream.PubAckFuture
		err error
	}
	ps := make([]pending, len(rows))
	for i, row := range rows {
		ps[i].row = row
		var h map[string]string
		if err := json.Unmarshal(row.Headers, &h); err != nil {
			ps[i].err = fmt.Errorf("headers: %w: %w", nats.ErrBadSubject, err) // a bad row, quarantined in the end
			continue
		}
		msg := &nats.Msg{Subject: row.NatsSubject, Data: row.Data, Header: nats.Header{}}
		for k, v := range h {
			msg.Header[k] = []string{v}
		}
		ps[i].f, ps[i].err = r.cfg.JetStream.PublishMsgAsync(msg, jetstream.WithMsgID(row.EventID))
	}
	timeout := time.NewTimer(r.cfg.AckTimeout)
	defer timeout.Stop()
	var ok []int64
	for i := range ps {
		p := &ps[i]
		if p.err != nil {
			continue
		}
		select {
		case <-p.f.Ok():
			ok = append(ok, p.row.ID)
		case err := <-p.f.Err():
			p.err = err
		case <-timeout.C:
			p.err = errors.New("no PubAck before AckTimeout")
			timeout.Reset(0)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	// A failure that is not the server refusing this row (no connection, no
	// PubAck in time, no stream answering) is an outage, not a bad row: it
	// must not count towards quarantine. Leave every row as it was; the
	// next round publishes again and the duplicate window drops what got
	// through.
	for _, p := range ps {
		if p.err != nil && !rowError(p.err) {
			return 0, fmt.Errorf("publish %s: %w", p.row.EventID, p.err)
		}
	}
	if r.cfg.beforeMark != nil {
		if err := r.cfg.beforeMark(); err != nil {
			return 0, err
		}
	}
	if len(ok) > 0 {
		if err := queries.OutboxMarkPublished(ctx, tx, ok); err != nil {
			return 0, fmt.Errorf("mark published: %w", err)
		}
	}
	for _, p := range ps {
		if p.err == nil {
			continue
		}
		backoff := math.Min(0.1*math.Pow(2, float64(p.row.Attempts)), r.cfg.BackoffMax.Seconds())
		q, err := queries.OutboxMarkFailed(ctx, tx, dbsqlc.OutboxMarkFailedParams{
			ID: p.row.ID, LastError: new(p.err.Error()), BackoffSeconds: backoff, MaxAttempts: int32(r.cfg.MaxAttempts),
		})
		if err != nil {
			return 0, fmt.Errorf("mark failed: %w", err)
		}
		r.m.failed.Inc()
		if q {
			r.m.quarantined.Inc()
			r.cfg.Logger.Error("outbox event quarantined", "event_id", p.row.EventID, "subject", p.row.NatsSubject, "err", p.err)
		} else {
			r.cfg.Logger.Warn("outbox publish failed; will retry", "event_id", p.row.EventID, "err", p.err, "backoff_s", backoff)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// A failed COMMIT may have committed: rows are re-read next time and
		// a re-publish is dropped by the duplicate window.
		return 0, fmt.Errorf("commit: %w", err)
	}
	r.m.published.Add(float64(len(ok)))
	return len(rows), nil
}
