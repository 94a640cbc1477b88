package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/reconciler/internal/dbsqlc"
)

// Replay defaults.
const (
	ReplayBatchSizeDefault = 500
	ReplayIdleWaitDefault  = 5 * time.Second
)

// ReplayConfig configures [Replay].
type ReplayConfig struct {
	// Pool reaches the reconciler's schema. Required.
	Pool *pgxpool.Pool
	// JetStream holds the streams. Required.
	JetStream jetstream.JetStream
	// BatchSize is how many events are applied per transaction. Defaults
	// to 500.
	BatchSize int
	// IdleWait is how long to wait for the next message of a stream before
	// asking the server whether more are coming. Defaults to 5 s.
	IdleWait time.Duration
	// Logger defaults to a discard logger.
	Logger *slog.Logger
}

// ReplayStats is what a replay did.
type ReplayStats struct {
	// Events is the number of messages read from the streams.
	Events int `json:"events"`
	// Applied events changed trip_view; Duplicates were already applied
	// (the same event stored twice, or applied by the live projection
	// while the replay ran); Skipped could not be decoded or are of a type
	// the projection does not read.
	Applied    int `json:"applied"`
	Duplicates int `json:"duplicates"`
	Skipped    int `json:"skipped"`
	// PerStream is the number of messages read from each stream.
	PerStream map[string]int `json:"per_stream"`
	// Trips is the number of rows in trip_view afterwards.
	Trips int64 `json:"trips"`
	// Duration is the wall time of the whole replay.
	Duration time.Duration `json:"duration_ns"`
}

// EventsPerSecond is Events over Duration.
func (s ReplayStats) EventsPerSecond() float64 {
	if s.Duration <= 0 {
		return 0
	}
	return float64(s.Events) / s.Duration.Seconds()
}

// ReplayProjection replays the projection named name; only
// [ProjectionName] ("reconciler") exists, any other name returns
// [ErrUnknownProjection].
func ReplayProjection(ctx context.Context, name string, cfg ReplayConfig) (ReplayStats, error) {
	if name != ProjectionName {
		return ReplayStats{}, fmt.Errorf("%w: %q (only %q can be replayed)", ErrUnknownProjection, name, ProjectionName)
	}
	return Replay(ctx, cfg)
}

// Replay rebuilds trip_view from the streams. It clears trip_view and the
// reconciler's inbox rows in one transaction, then reads every stream the
// projection consumes (TRIPS, HOTEL, PAYMENT, CAR) from sequence 1 up to
// its last message at that moment, with a new ordered (ephemeral) consumer
// per stream; the durable "reconciler" consumers are not touched. Each
// event goes through the live projection's own logic and inbox, in
// batches of BatchSize per transaction. Messages that cannot be decoded,
// or whose type the projection does not read, are skipped and counted.
//
// It is safe to run while "tripsaga serve reconciler" runs:
//
//   - a session advisory lock is held for the whole replay: a second
//     replay waits, and sweeps are skipped (they would judge a half-built
//     view);
//   - the clearing transaction takes the projection lock exclusively,
//     which every live projection transaction takes shared, so no live
//     transaction straddles the clear;
//   - the replay writes the same inbox rows as the live consumers, so an
//     event applied by both counts once, whichever comes first; events
//     published after the replay read its stream's last sequence are left
//     to the durable consumers.
//
// The live projection keeps running meanwhile, so trip_view is incomplete
// until Replay returns. Errors of a batch that lost a deadlock to the live
// projection are retried.
func Replay(ctx context.Context, cfg ReplayConfig) (ReplayStats, error) {
	if cfg.Pool == nil || cfg.JetStream == nil {
		return ReplayStats{}, fmt.Errorf("%w: Pool and JetStream are required", ErrInvalidConfig)
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = ReplayBatchSizeDefault
	}
	if cfg.IdleWait <= 0 {
		cfg.IdleWait = ReplayIdleWaitDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	stats := ReplayStats{PerStream: map[string]int{}}

	conn, err := cfg.Pool.Acquire(ctx)
	if err != nil {
		return stats, fmt.Errorf("replay: %w", err)
	}
	defer conn.Release()
	if err := queries.ReplayLock(ctx, conn); err != nil {
		return stats, fmt.Errorf("replay: lock: %w", err)
	}
	defer func() {
		if err := queries.ReplayUnlock(context.Background(), conn); err != nil {
			// The session may be unusable; closing it drops the lock.
			_ = conn.Conn().Close(context.Background())
		}
	}()

	if err := clearProjection(ctx, cfg.Pool); err != nil {
		return stats, err
	}
	types := projectionTypes()
	wanted := map[string]bool{}
	for _, t := range types {
		wanted[t] = true
	}
	var streams []string
	for s := range events.Default.Streams(types) {
		streams = append(streams, s)
	}
	slices.Sort(streams)
	for _, name := range streams {
		if err := replayStream(ctx, cfg, name, wanted, &stats); err != nil {
			return stats, err
		}
	}
	if stats.Trips, err = queries.TripViewCount(ctx, cfg.Pool); err != nil {
		return stats, fmt.Errorf("replay: count: %w", err)
	}
	stats.Duration = time.Since(start)
	cfg.Logger.Info("reconciler: replay done", "events", stats.Events, "applied", stats.Applied,
		"duplicates", stats.Duplicates, "skipped", stats.Skipped, "trips", stats.Trips, "duration", stats.Duration)
	return stats, nil
}

func clearProjection(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("replay: clear: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if err := queries.ProjectionLockExclusive(ctx, tx); err != nil {
		return fmt.Errorf("replay: projection lock: %w", err)
	}
	if _, err := queries.TripViewDeleteAll(ctx, tx); err != nil {
		return fmt.Errorf("replay: clear trip_view: %w", err)
	}
	if _, err := queries.InboxDeleteByConsumer(ctx, tx, ProjectionName); err != nil {
		return fmt.Errorf("replay: clear inbox: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("replay: clear: commit: %w", err)
	}
	return nil
}

// replayItem is one decoded event with its place in its stream.
type replayItem struct {
	e   event.Event
	seq uint64
}

func replayStream(ctx context.Context, cfg ReplayConfig, name string, wanted map[string]bool, stats *ReplayStats) error {
	stream, err := cfg.JetStream.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("replay: stream %s: %w", name, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("replay: stream %s: %w", name, err)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	last := info.State.LastSeq
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   1,
	})
	if err != nil {
		return fmt.Errorf("replay: consumer on %s: %w", name, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(cfg.BatchSize))
	if err != nil {
		return fmt.Errorf("replay: read %s: %w", name, err)
	}
	defer it.Stop()

	var batch []replayItem
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		applied, dup, err := applyBatch(ctx, cfg.Pool, name, batch)
		if err != nil {
			return err
		}
		stats.Applied += applied
		stats.Duplicates += dup
		batch = batch[:0]
		return nil
	}
	var pos uint64
	for pos < last {
		msg, err := it.Next(jetstream.NextMaxWait(cfg.IdleWait))
		if errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// Nothing came: the tail may have been removed (max age, a
			// delete) since we read the stream's state.
			info, ierr := stream.Info(ctx)
			if ierr != nil {
				return fmt.Errorf("replay: stream %s: %w", name, ierr)
			}
			if info.State.Msgs == 0 || info.State.LastSeq <= pos || info.State.FirstSeq > last {
				break
			}
			cfg.Logger.Warn("reconciler: replay waiting for messages", "stream", name, "at", pos, "until", last)
			continue
		}
		if err != nil {
			return fmt.Errorf("replay: read %s after %d: %w", name, pos, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("replay: %s: metadata: %w", name, err)
		}
		pos = md.Sequence.Stream
		stats.Events++
		stats.PerStream[name]++
		e, err := events.Decode(msg.Headers(), msg.Data())
		if err == nil && !wanted[e.Type()] {
			err = fmt.Errorf("%w: %q", events.ErrUnknownType, e.Type())
		}
		if err == nil {
			err = applicable(e)
		}
		if err != nil {
			stats.Skipped++
			cfg.Logger.Debug("reconciler: replay skipped a message", "stream", name, "stream_seq", pos, "subject", msg.Subject(), "err", err)
		} else {
			batch = append(batch, replayItem{e: e, seq: pos})
		}
		if len(batch) >= cfg.BatchSize {
			if err := flush(); err != nil {
				return err
			}
		}
		if md.NumPending == 0 {
			break // nothing after it in the stream right now
		}
	}
	return flush()
}

// applyBatch applies items in one transaction through the inbox, retrying
// the whole batch when PostgreSQL aborts it for a deadlock or a
// serialization failure (the live projection may hold the same rows).
func applyBatch(ctx context.Context, pool *pgxpool.Pool, stream string, items []replayItem) (applied, dup int, err error) {
	for attempt := 1; ; attempt++ {
		applied, dup, err = applyBatchOnce(ctx, pool, stream, items)
		var pgErr *pgconn.PgError
		if err == nil || attempt >= 5 || !errors.As(err, &pgErr) || (pgErr.Code != "40P01" && pgErr.Code != "40001") {
			return applied, dup, err
		}
	}
}

func applyBatchOnce(ctx context.Context, pool *pgxpool.Pool, stream string, items []replayItem) (applied, dup int, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("replay: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	applied, dup, err = applyItems(ctx, tx, stream, items)
	if err != nil {
		return 0, 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("replay: commit: %w", err)
	}
	return applied, dup, nil
}

// applyItems applies items of one stream to trip_view inside tx, each
// behind its inbox row (consumer "reconciler"), the whole batch in one round
// trip, in trip id order so that concurrent batches lock rows in the same
// order. It returns how many were applied and how many the inbox already
// had.
func applyItems(ctx context.Context, tx pgx.Tx, stream string, items []replayItem) (applied, dup int, err error) {
	items = slices.Clone(items)
	slices.SortStableFunc(items, func(a, b replayItem) int { return strings.Compare(a.e.Subject(), b.e.Subject()) })
	// The whole batch goes to the server in one round trip: per event, the
	// inbox row and the same trip_view upsert as [apply].
	params := make([]dbsqlc.TripViewReplayApplyParams, len(items))
	for i, it := range items {
		kind := events.Kind(it.e.Type())
		status, settled := Status([]string{kind})
		at := it.e.Time().UTC()
		if it.e.Time().IsZero() {
			at = time.Now().UTC()
		}
		params[i] = dbsqlc.TripViewReplayApplyParams{
			TripID: it.e.Subject(), Kind: kind, NewStatus: status, NewSettled: nonEmpty(settled), At: at,
			Consumer: ProjectionName, Source: it.e.Source(), EventID: it.e.ID(), CeType: it.e.Type(),
			Stream: stream, StreamSeq: int64(it.seq),
		}
	}
	// As in apply, the status follows from the merged seen; within the
	// batch only each trip's last merge matters, and the stored status is
	// still the one from before the batch (or the insert).
	type merged struct {
		seen            []string
		status, settled string
	}
	last := map[string]merged{}
	var qerr error
	queries.TripViewReplayApply(ctx, tx, params).QueryRow(func(i int, row dbsqlc.TripViewReplayApplyRow, err error) {
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			dup++ // the inbox had it
		case err != nil:
			if qerr == nil {
				qerr = fmt.Errorf("replay: %s seq %d: %w", stream, items[i].seq, err)
			}
		default:
			applied++
			last[row.TripID] = merged{row.Seen, row.Status, deref(row.Settled)}
		}
	})
	if qerr != nil {
		return 0, 0, qerr
	}
	var upd dbsqlc.TripViewSetStatusManyParams
	for trip, m := range last {
		status, settled := Status(m.seen)
		if status != m.status || settled != m.settled {
			upd.TripIds = append(upd.TripIds, trip)
			upd.Statuses = append(upd.Statuses, status)
			upd.Settled = append(upd.Settled, settled)
		}
	}
	if len(upd.TripIds) > 0 {
		if err := queries.TripViewSetStatusMany(ctx, tx, upd); err != nil {
			return 0, 0, fmt.Errorf("replay: status: %w", err)
		}
	}
	return applied, dup, nil
}
