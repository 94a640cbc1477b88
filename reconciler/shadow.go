package reconciler

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/reconciler/internal/dbsqlc"
)

// ShadowDiff is one trip on which the shadow rebuild and the live view
// differ. A side that lacks the trip has Status "".
type ShadowDiff struct {
	TripID       string `json:"trip_id"`
	LiveSeen     string `json:"live_seen"`
	ShadowSeen   string `json:"shadow_seen"`
	LiveStatus   string `json:"live_status"`
	ShadowStatus string `json:"shadow_status"`
	LiveEvents   int    `json:"live_events"`
	ShadowEvents int    `json:"shadow_events"`
	// TimesDiffer: the first or last event times differ.
	TimesDiffer bool `json:"times_differ"`
}

// ShadowStats is what a shadow rebuild did.
type ShadowStats struct {
	// Events read from the streams; Applied the distinct ones folded in
	// (Skipped could not be decoded or are of a type the view does not
	// read).
	Events, Applied, Skipped int
	// Trips in the shadow; Diffs where it differs from the live view.
	Trips int64
	Diffs []ShadowDiff
	// Duration of the rebuild and comparison.
	Duration time.Duration `json:"duration_ns"`
}

// EventsPerSecond is Events over Duration.
func (s ShadowStats) EventsPerSecond() float64 {
	if s.Duration <= 0 {
		return 0
	}
	return float64(s.Events) / s.Duration.Seconds()
}

// shadowTrip is one trip of the shadow, folded in memory.
type shadowTrip struct {
	kinds       []string
	n           int32
	first, last time.Time
}

// ReplayShadow rebuilds the view from every stream the projection reads
// (as [Replay] does, by the same rules: the kinds seen, distinct events,
// the events' own times) into trip_view_shadow, leaving trip_view and the
// inbox alone, and returns where the two differ. progress, when set, is
// called with the number of events read so far.
//
// Differences are expected for events that arrived after the streams were
// read (the live view has them) and for events the live view never got
// (a parked event, a projection bug): those are what it is for.
func ReplayShadow(ctx context.Context, cfg ReplayConfig, progress func(read int)) (ShadowStats, error) {
	if cfg.Pool == nil || cfg.JetStream == nil {
		return ShadowStats{}, fmt.Errorf("%w: Pool and JetStream are required", ErrInvalidConfig)
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = ReplayBatchSizeDefault
	}
	if cfg.IdleWait <= 0 {
		cfg.IdleWait = ReplayIdleWaitDefault
	}
	start := time.Now()
	var st ShadowStats
	g, gctx := errgroup.WithContext(ctx)
	per, items := readProjectionStreams(gctx, g, cfg, &replayOrigins{}) // checks no origin: a trigger the live view parked is a difference
	trips := map[string]*shadowTrip{}
	seen := map[[2]string]bool{}
	g.Go(func() error {
		n := 0
		for it := range items {
			n++
			if progress != nil && n%256 == 0 {
				progress(n)
			}
			k := [2]string{it.e.Source(), it.e.ID()}
			if seen[k] {
				continue
			}
			seen[k] = true
			at := it.e.Time().UTC()
			t := trips[it.e.Subject()]
			if t == nil {
				t = &shadowTrip{first: at, last: at}
				trips[it.e.Subject()] = t
			}
			if kind := events.Kind(it.e.Type()); !slices.Contains(t.kinds, kind) {
				t.kinds = append(t.kinds, kind)
			}
			t.n++
			t.first, t.last = minTime(t.first, at), maxTime(t.last, at)
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return st, err
	}
	for _, p := range per {
		st.Events += p.Events
		st.Skipped += p.Skipped
	}
	st.Applied = len(seen)
	if progress != nil {
		progress(st.Events)
	}

	var p dbsqlc.ShadowInsertManyParams
	for _, trip := range slices.Sorted(maps.Keys(trips)) {
		t := trips[trip]
		slices.Sort(t.kinds)
		status, settled := Status(cfg.catalogue(), t.kinds)
		p.TripIds = append(p.TripIds, trip)
		p.Seens = append(p.Seens, strings.Join(t.kinds, ","))
		p.Statuses = append(p.Statuses, status)
		p.Settled = append(p.Settled, settled)
		p.Counts = append(p.Counts, t.n)
		p.FirstAts = append(p.FirstAts, t.first)
		p.LastAts = append(p.LastAts, t.last)
	}
	tx, err := cfg.Pool.Begin(ctx)
	if err != nil {
		return st, fmt.Errorf("shadow: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if err := queries.ShadowDeleteAll(ctx, tx); err != nil {
		return st, fmt.Errorf("shadow: clear: %w", err)
	}
	if err := queries.ShadowInsertMany(ctx, tx, p); err != nil {
		return st, fmt.Errorf("shadow: write: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return st, fmt.Errorf("shadow: commit: %w", err)
	}
	st.Trips = int64(len(trips))
	if st.Diffs, err = ShadowDiffs(ctx, cfg.Pool); err != nil {
		return st, err
	}
	st.Duration = time.Since(start)
	return st, nil
}

// ShadowDiffs returns where trip_view_shadow and trip_view differ.
func ShadowDiffs(ctx context.Context, db dbsqlc.DBTX) ([]ShadowDiff, error) {
	rows, err := queries.ShadowDiff(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("shadow: compare: %w", err)
	}
	out := make([]ShadowDiff, 0, len(rows))
	for _, r := range rows {
		out = append(out, ShadowDiff{TripID: r.TripID, LiveSeen: r.LiveSeen, ShadowSeen: r.ShadowSeen, LiveStatus: r.LiveStatus,
			ShadowStatus: r.ShadowStatus, LiveEvents: int(r.LiveEvents), ShadowEvents: int(r.ShadowEvents), TimesDiffer: r.TimesDiffer})
	}
	return out, nil
}
