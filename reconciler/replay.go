package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"golang.org/x/sync/errgroup"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/reconciler/internal/dbsqlc"
	"github.com/tripsaga/tripsaga/saga"
)

// Replay defaults.
const (
	ReplayBatchSizeDefault = 1000
	ReplayIdleWaitDefault  = 5 * time.Second
)

// ReplayConfig configures [Replay].
type ReplayConfig struct {
	// Pool reaches the reconciler's schema. Required.
	Pool *pgxpool.Pool
	// JetStream holds the streams. Required.
	JetStream jetstream.JetStream
	// Catalogue is the saga's steps as the system runs them (STEPS): a
	// missing stream of a step it does not run is skipped. Zero:
	// events.Default.
	Catalogue events.Catalogue
	// BatchSize is how many events are applied per transaction. Defaults
	// to 500.
	BatchSize int
	// IdleWait is how long to wait for the next message of a stream before
	// asking the server whether more are coming. Defaults to 5 s.
	IdleWait time.Duration
	// Logger defaults to a discard logger.
	Logger *slog.Logger
	// Progress, when set, is called with 1 for every message read from
	// the streams (from several goroutines at once), e.g. for a progress
	// bar.
	Progress func(read int)
	// Origin, when set, makes the replay skip what the live projection
	// parks ([Config.Origin]): a trigger published by a step service for
	// a trip that has no trip.requested (more than OriginGrace after the
	// trigger's time) or whose trip.requested carries another request. A
	// trigger whose trip.requested was read by the replay, or is in
	// trip_view already, costs nothing; any other one JetStream read. Nil:
	// every event is replayed.
	Origin saga.OriginFunc
	// OriginGrace defaults to saga.DefaultOriginGrace(); within it a
	// trigger without a trip.requested is replayed (the live projection
	// would wait for it).
	OriginGrace time.Duration
}

// catalogue is cfg.Catalogue, or events.Default.
func (cfg ReplayConfig) catalogue() events.Catalogue {
	if len(cfg.Catalogue.Steps) == 0 {
		return events.Default
	}
	return cfg.Catalogue
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
	// NoOrigin counts, among Skipped, the triggers no trip.requested
	// backs (see ReplayConfig.Origin): the live projection parks them.
	NoOrigin int `json:"no_origin"`
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
// until Replay returns. The clear records the rebuild as under way
// (view_rebuild) and only the replay's end records it finished: a replay
// killed half-way (SIGKILL after the clear) leaves it unfinished, the
// sweep then judges no half-built view, the dashboard says the view is
// being rebuilt, until a replay run again finishes it. A batch that lost
// a deadlock to the live projection is retried.
//
// With cfg.Origin, a trigger that the live projection parks because no
// trip.requested backs it is left out too (counted in Skipped and
// NoOrigin), so that the rebuilt view shows no trip the live one refused.
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
	if cfg.OriginGrace <= 0 {
		cfg.OriginGrace = saga.DefaultOriginGrace()
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

	if err := clearProjection(ctx, conn); err != nil {
		return stats, err
	}
	if err := fault.Hit(ctx, fault.At("reconciler", "replay", "after_clear"), ""); err != nil {
		return stats, fmt.Errorf("replay: %w", err)
	}
	// The appliers use the pool's other connections; with a pool of one
	// (pool_max_conns=1) one applier uses the connection that holds the
	// lock, instead of waiting for a second that never comes.
	var db beginner = cfg.Pool
	appliers := min(replayAppliers, int(cfg.Pool.Config().MaxConns)-1)
	if appliers < 1 {
		appliers, db = 1, conn
	}
	// The streams are read at once, each by its own ordered consumer, into
	// one applier: a batch mixes the streams, so a trip's events, which lie
	// near each other in every stream, mostly merge into one row write.
	g, gctx := errgroup.WithContext(ctx)
	origins := &replayOrigins{guard: originGuard{origin: cfg.Origin, grace: cfg.OriginGrace}, log: cfg.Logger}
	per, items := readProjectionStreams(gctx, g, cfg, origins)
	// Appliers take turns on the channel; PostgreSQL works for several at
	// once (batches lock rows in trip id order and a lost deadlock is
	// retried).
	var mu sync.Mutex
	for range appliers {
		g.Go(func() error {
			batch := make([]replayItem, 0, cfg.BatchSize)
			flush := func() error {
				if len(batch) == 0 {
					return nil
				}
				applied, dup, unbacked, err := applyBatch(gctx, db, batch, origins)
				mu.Lock()
				stats.Applied += applied
				stats.Duplicates += dup
				stats.Skipped += unbacked
				stats.NoOrigin += unbacked
				mu.Unlock()
				batch = batch[:0]
				return err
			}
			for it := range items {
				batch = append(batch, it)
				if len(batch) >= cfg.BatchSize {
					if err := flush(); err != nil {
						return err
					}
				}
			}
			return flush()
		})
	}
	if err := g.Wait(); err != nil {
		return stats, err
	}
	for _, p := range per {
		stats.Events += p.Events
		stats.Skipped += p.Skipped
		for k, v := range p.PerStream {
			stats.PerStream[k] += v
		}
	}
	// Only now is the view whole again: a replay killed before this line
	// leaves its rebuild unfinished, and the reconciler runs it again.
	if err := queries.RebuildFinish(ctx, conn, ProjectionName); err != nil {
		return stats, fmt.Errorf("replay: finish: %w", err)
	}
	if stats.Trips, err = queries.TripViewCount(ctx, conn); err != nil {
		return stats, fmt.Errorf("replay: count: %w", err)
	}
	stats.Duration = time.Since(start)
	cfg.Logger.Info("reconciler: replay done", "events", stats.Events, "applied", stats.Applied,
		"duplicates", stats.Duplicates, "skipped", stats.Skipped, "no_origin", stats.NoOrigin, "trips", stats.Trips, "duration", stats.Duration)
	return stats, nil
}

// beginner is a pool or one of its connections.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

func clearProjection(ctx context.Context, db beginner) error {
	tx, err := db.Begin(ctx)
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
	if err := queries.RebuildBegin(ctx, tx, ProjectionName); err != nil {
		return fmt.Errorf("replay: clear: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("replay: clear: commit: %w", err)
	}
	return nil
}

// replayAppliers is how many batches a replay applies at once.
const replayAppliers = 4

// replayItem is one decoded event with its place in its stream.
type replayItem struct {
	e      event.Event
	stream string
	seq    uint64
}

// readProjectionStreams starts on g one reader per stream that holds an
// event type the projection reads (each an ordered consumer, see
// replayStream), all sending to the returned channel, which is closed once
// every reader has reached its stream's end. per[i] counts what the i-th
// stream (in name order) gave.
func readProjectionStreams(ctx context.Context, g *errgroup.Group, cfg ReplayConfig, origins *replayOrigins) (per []ReplayStats, items <-chan replayItem) {
	types := projectionTypes()
	wanted := map[string]bool{}
	for _, t := range types {
		wanted[t] = true
	}
	var streams []string
	for s := range events.Full().Streams(types) {
		streams = append(streams, s)
	}
	slices.Sort(streams)
	per = make([]ReplayStats, len(streams))
	ch := make(chan replayItem, 2*cfg.BatchSize)
	var readers sync.WaitGroup
	for i, name := range streams {
		per[i].PerStream = map[string]int{}
		readers.Add(1)
		g.Go(func() error {
			defer readers.Done()
			return replayStream(ctx, cfg, name, wanted, origins, &per[i], ch)
		})
	}
	go func() { readers.Wait(); close(ch) }()
	return per, ch
}

func replayStream(ctx context.Context, cfg ReplayConfig, name string, wanted map[string]bool, origins *replayOrigins, stats *ReplayStats, out chan<- replayItem) error {
	stream, err := cfg.JetStream.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, ours := cfg.catalogue().StreamSubjects()[name]; !ours {
			// A stream of another version's step (INSURANCE) that this
			// system never made: it holds nothing to replay.
			return nil
		}
	}
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
		if cfg.Progress != nil {
			cfg.Progress(1)
		}
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
			origins.read(e)
			select {
			case out <- replayItem{e: e, stream: name, seq: pos}:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if md.NumPending == 0 {
			break // nothing after it in the stream right now
		}
	}
	return nil
}

// applyBatch applies items in one transaction through the inbox, retrying
// the whole batch when PostgreSQL aborts it for a deadlock or a
// serialization failure (the live projection may hold the same rows).
// unbacked is how many origins left out (see [replayOrigins.keep]).
func applyBatch(ctx context.Context, db beginner, items []replayItem, origins *replayOrigins) (applied, dup, unbacked int, err error) {
	for attempt := 1; ; attempt++ {
		applied, dup, unbacked, err = applyBatchOnce(ctx, db, items, origins)
		var pgErr *pgconn.PgError
		if err == nil || attempt >= 5 || !errors.As(err, &pgErr) || (pgErr.Code != "40P01" && pgErr.Code != "40001") {
			return applied, dup, unbacked, err
		}
	}
}

func applyBatchOnce(ctx context.Context, db beginner, items []replayItem, origins *replayOrigins) (applied, dup, unbacked int, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("replay: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	kept, err := origins.keep(ctx, tx, items)
	if err != nil {
		return 0, 0, 0, err
	}
	if applied, dup, err = applyItems(ctx, tx, kept); err != nil {
		return 0, 0, 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, 0, fmt.Errorf("replay: commit: %w", err)
	}
	return applied, dup, len(items) - len(kept), nil
}

// applyItems applies items to trip_view inside tx, each behind its inbox
// row (consumer "reconciler"), in two set-based statements whatever their
// number: the inbox rows of all, then one merge per trip of the new ones,
// in trip id order so that concurrent batches lock rows in the same order;
// a third sets the statuses that the merges changed. It returns how many
// were applied and how many the inbox already had.
func applyItems(ctx context.Context, tx pgx.Tx, items []replayItem) (applied, dup int, err error) {
	in := dbsqlc.ProjectionInboxInsertManyParams{Consumer: ProjectionName}
	for _, it := range items {
		in.Sources = append(in.Sources, it.e.Source())
		in.EventIds = append(in.EventIds, it.e.ID())
		in.CeTypes = append(in.CeTypes, it.e.Type())
		in.Streams = append(in.Streams, it.stream)
		in.Seqs = append(in.Seqs, int64(it.seq))
	}
	fresh, err := queries.ProjectionInboxInsertMany(ctx, tx, in)
	if err != nil {
		return 0, 0, fmt.Errorf("projection: inbox: %w", err)
	}
	isFresh := make(map[[2]string]bool, len(fresh))
	for _, f := range fresh {
		isFresh[[2]string{f.Source, f.EventID}] = true
	}
	// One merge per trip, of the kinds its new events bring.
	type group struct {
		version     string // the first of its events' versions
		kinds       []string
		n           int32
		first, last time.Time
	}
	groups := map[string]*group{}
	var refunds []event.Event // fresh trip.cancellation_requested, applied after the merge
	for _, it := range items {
		k := [2]string{it.e.Source(), it.e.ID()}
		if !isFresh[k] {
			dup++
			continue
		}
		delete(isFresh, k) // an event twice in one batch counts once
		applied++
		if it.e.Type() == events.TripCancellationRequested {
			refunds = append(refunds, it.e)
		}
		at := it.e.Time().UTC()
		if it.e.Time().IsZero() {
			// CloudEvents time is optional; our producers always set it.
			at = time.Now().UTC()
		}
		trip := it.e.Subject()
		g := groups[trip]
		if g == nil {
			g = &group{first: at, last: at}
			groups[trip] = g
		}
		if g.version == "" {
			g.version = events.VersionOf(it.e)
		}
		if kind := events.Kind(it.e.Type()); !slices.Contains(g.kinds, kind) {
			g.kinds = append(g.kinds, kind)
		}
		g.n++
		g.first, g.last = minTime(g.first, at), maxTime(g.last, at)
	}
	if len(groups) == 0 {
		return applied, dup, nil
	}
	var p dbsqlc.TripViewApplyManyParams
	for _, trip := range slices.Sorted(maps.Keys(groups)) {
		g := groups[trip]
		slices.Sort(g.kinds)
		status, settled := StatusOf(g.version, g.kinds)
		p.TripIds = append(p.TripIds, trip)
		p.Versions = append(p.Versions, g.version)
		p.Kinds = append(p.Kinds, strings.Join(g.kinds, ","))
		p.Statuses = append(p.Statuses, status)
		p.Settled = append(p.Settled, settled)
		p.Counts = append(p.Counts, g.n)
		p.FirstAts = append(p.FirstAts, g.first)
		p.LastAts = append(p.LastAts, g.last)
	}
	rows, err := queries.TripViewApplyMany(ctx, tx, p)
	if err != nil {
		return 0, 0, fmt.Errorf("projection: trip_view: %w", err)
	}
	for _, e := range refunds {
		if err := recordRefund(ctx, tx, e); err != nil {
			return 0, 0, err
		}
	}
	// As in apply, the status follows from the merged seen.
	var upd dbsqlc.TripViewSetStatusManyParams
	for _, row := range rows {
		status, settled := StatusOf(row.Version, row.Seen)
		if status != row.Status || settled != deref(row.Settled) {
			upd.TripIds = append(upd.TripIds, row.TripID)
			upd.Statuses = append(upd.Statuses, status)
			upd.Settled = append(upd.Settled, settled)
		}
	}
	if len(upd.TripIds) > 0 {
		if err := queries.TripViewSetStatusMany(ctx, tx, upd); err != nil {
			return 0, 0, fmt.Errorf("projection: status: %w", err)
		}
	}
	return applied, dup, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
