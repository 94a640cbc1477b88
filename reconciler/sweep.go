package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/reconciler/internal/dbsqlc"
	"github.com/tripsaga/tripsaga/services/trips"
)

// Finding kinds.
const (
	// FindingHalf: the trip is settled (trip.confirmed or trip.canceled
	// seen) but the companies' records disagree. Confirmed needs exactly
	// one hold held, one charge charged and one booking booked; canceled
	// needs none of them (a refunded charge is fine). Canceled by the
	// traveler needs no hold held and no booking booked, and the charge
	// refunded by exactly the charge minus the fee (or, when the fee is the
	// whole charge, left charged): a hold, a booking or an unrefunded
	// remainder left is half.
	FindingHalf = "half"
	// FindingOrphan: a company record is in force (held, charged, booked)
	// for a trip whose trip.requested the projection never saw.
	FindingOrphan = "orphan"
	// FindingStuck: the trip is not settled and its newest event is older
	// than [Config.StuckAfter]. This covers pending and canceling trips,
	// and a trip whose steps are all done or undone but whose trip.*
	// settling event never came.
	FindingStuck = "stuck"
	// FindingOpenUndo: the trip is not settled because the undo of a step
	// raised its incident (its stuck event, payment.refund_stuck, was seen
	// and not its undo's own event: trips.OpenUndos) while the steps
	// before it were undone: one named open undo, not a half trip. The
	// detail names the step and what the companies hold; found at once
	// (the incident is raised already), resolved when the undo is done
	// (by the company, or settled by an operator).
	FindingOpenUndo = "open_undo"
)

// FindingKinds lists every finding kind.
var FindingKinds = []string{FindingHalf, FindingOrphan, FindingStuck, FindingUnattributed, FindingOpenUndo} //nolint:gochecknoglobals // read-only

var statuses = []string{trips.StatusPending, trips.StatusConfirmed, trips.StatusCanceling, trips.StatusCanceled, trips.StatusCancelingByTraveler, trips.StatusCanceledByTraveler} //nolint:gochecknoglobals // read-only

type metrics struct {
	findings *prometheus.GaugeVec
	trips    *prometheus.GaugeVec
	sweeps   *prometheus.CounterVec
	lastOK   prometheus.Gauge
	// unreadable is tripsaga_reconciler_company_unreadable (unattributed.go).
	unreadable *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		findings: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tripsaga_reconciler_findings",
			Help: "Open reconciler findings, by kind (half, orphan, stuck, unattributed, open_undo), as of the last sweep.",
		}, []string{"kind"}),
		trips: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tripsaga_reconciler_trips",
			Help: "Trips in the reconciler's projection, by status, as of the last sweep.",
		}, []string{"status"}),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tripsaga_reconciler_sweeps_total",
			Help: "Reconciler sweeps, by outcome (ok, failed, skipped: a replay was running).",
		}, []string{"outcome"}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tripsaga_reconciler_last_sweep_timestamp_seconds",
			Help: "Unix time of the last sweep that completed.",
		}),
		unreadable: unreadableMetric(),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.findings, m.trips, m.sweeps, m.lastOK, m.unreadable} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// SweepResult is what one sweep did.
type SweepResult struct {
	// At is when the sweep started; Duration how long it took.
	At       time.Time     `json:"at"`
	Duration time.Duration `json:"duration_ns"`
	// Skipped: a replay held the view, or another replica was sweeping,
	// so nothing was judged here; SkippedFor says which.
	Skipped    bool   `json:"skipped"`
	SkippedFor string `json:"skipped_for,omitempty"`
	// Records is the number of company records read; Trips the number of
	// trips in the projection.
	Records int `json:"records"`
	Trips   int `json:"trips"`
	// Open counts the findings that hold now, by kind, but those an
	// operator dismissed (Dismissed counts these); Resolved the findings
	// this sweep closed.
	Open      map[string]int `json:"open"`
	Dismissed int            `json:"dismissed"`
	Resolved  int            `json:"resolved"`
	// Err is the error of a failed sweep.
	Err string `json:"error,omitempty"`
	// Unreadable names the companies whose records the sweep could not
	// read, with why; such a sweep judges nothing (see [UnreadableError]).
	Unreadable map[string]string `json:"unreadable,omitempty"`
	// OpenSteps is how many trips wait on an unfinished step (open_steps,
	// the trip list's); StepsUnread names the services whose step logs
	// could not be read, with why (their rows were kept).
	OpenSteps   int      `json:"open_steps"`
	StepsUnread []string `json:"steps_unread,omitempty"`
}

// LastSweep returns the result of the last sweep, or nil before the first.
func (r *Reconciler) LastSweep() *SweepResult { return r.last.Load() }

// companyRecords are one trip's records at the companies, by step and
// status.
type companyRecords struct {
	by map[string]map[string]int // step -> status word -> records
	// unattributed says why a record could not be joined with a trip
	// (FindingUnattributed); such an entry stands for one record.
	unattributed string
	active       []string // "hotel hold T-1:hotel held", for orphans
	// refunded sums the refunded_cents of the trip's refunded charges.
	refunded int64
}

// Sweep reads the companies' records, compares them with trip_view and
// records the findings that hold now, resolving the others. Sweeps of one
// Reconciler run one at a time. If a company cannot be listed the sweep
// fails and leaves every finding as it was (a partial list would resolve
// findings that still hold). While a [Replay] runs the sweep is skipped.
func (r *Reconciler) Sweep(ctx context.Context) (res SweepResult, err error) {
	r.sweepMu.Lock()
	defer r.sweepMu.Unlock()
	res = SweepResult{At: time.Now().UTC(), Open: map[string]int{}}
	defer func() {
		res.Duration = time.Since(res.At)
		switch {
		case err != nil:
			res.Err = err.Error()
			r.metrics.sweeps.WithLabelValues("failed").Inc()
		case res.Skipped:
			r.metrics.sweeps.WithLabelValues("skipped").Inc()
		default:
			r.metrics.sweeps.WithLabelValues("ok").Inc()
			r.metrics.lastOK.Set(float64(time.Now().Unix()))
		}
		if ctx.Err() == nil {
			r.last.Store(&res)
		}
	}()

	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("sweep: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	locked, err := queries.SweepTryLockShared(ctx, tx)
	if err != nil {
		return res, fmt.Errorf("sweep: lock: %w", err)
	}
	if !locked {
		res.Skipped, res.SkippedFor = true, "a replay was rebuilding the projection"
		r.log.Info("reconciler: sweep skipped, a replay is rebuilding the view")
		return res, nil
	}
	// A rebuild that stopped half-way (killed after its clear) leaves the
	// view missing trips: judged, every company record of theirs would be
	// a false orphan. No sweep until a replay finishes it.
	since, err := queries.RebuildUnfinished(ctx, tx, ProjectionName)
	if err != nil {
		return res, fmt.Errorf("sweep: rebuild: %w", err)
	}
	if len(since) > 0 {
		res.Skipped = true
		res.SkippedFor = fmt.Sprintf("the rebuild of the view begun %s stopped half-way; run `tripsaga replay reconciler` again to finish it", since[0].UTC().Format(time.RFC3339))
		r.log.Warn("reconciler: sweep skipped, the view's rebuild stopped half-way", "since", since[0])
		return res, nil
	}
	if locked, err = queries.SweepTryLockLeader(ctx, tx); err != nil {
		return res, fmt.Errorf("sweep: lock: %w", err)
	}
	if !locked {
		res.Skipped, res.SkippedFor = true, "another replica was sweeping"
		r.log.Debug("reconciler: sweep skipped, another replica is sweeping")
		return res, nil
	}
	// The step each unsettled trip waits on, for the trip list, in a
	// transaction of its own (kept when the sweep then fails, a company
	// unreadable): a service that cannot be read keeps its rows and is
	// named.
	err = pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		res.OpenSteps, res.StepsUnread, err = r.refreshOpenSteps(ctx, tx)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("sweep: %w", err)
	}
	// The view is read before the companies: a trip settled in it had its
	// records made (confirmed) or undone (canceled) before we list them.
	view, err := queries.TripViewListAll(ctx, tx)
	if err != nil {
		return res, fmt.Errorf("sweep: trip_view: %w", err)
	}
	res.Trips = len(view)
	// The sweep's transaction waits while the companies are listed (its
	// locks keep a replay from clearing the view meanwhile): a statement
	// after each page keeps it from being ended as idle
	// (idle_in_transaction_session_timeout, 30 s; process.PGIdleInTransactionTimeout)
	// however many pages there are.
	recs, n, err := r.listCompanies(ctx, func(ctx context.Context) error {
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	})
	if err != nil {
		res.Unreadable = unreadableOf(err)
		return res, err
	}
	res.Records = n
	now := time.Now()

	type found struct{ trip, kind, detail string }
	var fs []found
	for _, v := range view {
		c := recs[v.TripID]
		switch deref(v.Settled) {
		case trips.StatusConfirmed:
			if !r.agree(v.Version, c, 1) {
				fs = append(fs, found{v.TripID, FindingHalf, "confirmed by events, but the companies have " + c.describe(r.companies())})
			}
		case trips.StatusCanceled:
			if c != nil && !r.agree(v.Version, c, 0) {
				fs = append(fs, found{v.TripID, FindingHalf, "canceled by events, but the companies have " + c.describe(r.companies())})
			}
		case trips.StatusCanceledByTraveler:
			if why := r.travelerHalf(c, v.RefundCents.Int64); why != "" {
				fs = append(fs, found{v.TripID, FindingHalf, "canceled by the traveler by events, but " + why + "; the companies have " + c.describe(r.companies())})
			}
		default:
			if open := trips.OpenUndosOf(v.Version, v.Seen); len(open) > 0 {
				fs = append(fs, found{v.TripID, FindingOpenUndo, fmt.Sprintf("%s with the undo of %s open (stuck, retried until it is done or an operator settles it); the companies have %s",
					v.Status, strings.Join(open, ", "), c.describe(r.companies()))})
				break
			}
			if age := now.Sub(v.LastEventAt); age > r.cfg.StuckAfter {
				fs = append(fs, found{v.TripID, FindingStuck, fmt.Sprintf("%s for %s since its last event; seen: %s",
					v.Status, age.Round(time.Second), strings.Join(v.Seen, ", "))})
			}
		}
	}
	// Orphans: the view is read again now, after the lists, so a trip
	// requested while we listed is not taken for one.
	var candidates []string
	for trip, c := range recs {
		if c.unattributed != "" {
			fs = append(fs, found{trip, FindingUnattributed, c.unattributed})
			continue
		}
		if len(c.active) > 0 {
			candidates = append(candidates, trip)
		}
	}
	requested, err := queries.TripViewListRequested(ctx, tx, candidates)
	if err != nil {
		return res, fmt.Errorf("sweep: requested trips: %w", err)
	}
	for _, trip := range candidates {
		if !slices.Contains(requested, trip) {
			fs = append(fs, found{trip, FindingOrphan, "no trip.requested seen, but in force: " + strings.Join(recs[trip].active, "; ")})
		}
	}

	p := dbsqlc.FindingUpsertManyParams{Now: now}
	for _, f := range fs {
		p.TripIds = append(p.TripIds, f.trip)
		p.Kinds = append(p.Kinds, f.kind)
		p.Details = append(p.Details, f.detail)
	}
	if err := queries.FindingUpsertMany(ctx, tx, p); err != nil {
		return res, fmt.Errorf("sweep: record findings: %w", err)
	}

	resolved, err := queries.FindingResolveOthers(ctx, tx, dbsqlc.FindingResolveOthersParams{Now: now, TripIds: p.TripIds, Kinds: p.Kinds})
	if err != nil {
		return res, fmt.Errorf("sweep: resolve findings: %w", err)
	}
	res.Resolved = int(resolved)
	// Open is what holds now less what an operator dismissed.
	open, err := queries.FindingCountOpenByKind(ctx, tx)
	if err != nil {
		return res, fmt.Errorf("sweep: count findings: %w", err)
	}
	res.Dismissed = len(fs)
	for _, o := range open {
		res.Open[o.Kind] = int(o.Findings)
		res.Dismissed -= int(o.Findings)
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("sweep: commit: %w", err)
	}
	for _, k := range FindingKinds {
		r.metrics.findings.WithLabelValues(k).Set(float64(res.Open[k]))
	}
	byStatus := map[string]int{}
	for _, v := range view {
		byStatus[v.Status]++
	}
	for _, s := range statuses {
		r.metrics.trips.WithLabelValues(s).Set(float64(byStatus[s]))
	}
	if len(fs) > 0 || resolved > 0 {
		r.log.Info("reconciler: sweep", "trips", res.Trips, "records", res.Records, "half", res.Open[FindingHalf],
			"orphan", res.Open[FindingOrphan], "stuck", res.Open[FindingStuck], "open_undo", res.Open[FindingOpenUndo], "resolved", resolved)
	}
	return res, nil
}

// listCompanies lists every record of the companies (the insurer's too
// with the insurance step on), one after another, calling keepAlive after
// each page but a list's last, and groups them by trip. It returns the
// number of records read.
func (r *Reconciler) listCompanies(ctx context.Context, keepAlive func(context.Context) error) (map[string]*companyRecords, int, error) {
	cos := r.companies()
	clients := r.clients()
	lists := make([][]provider.Record, len(clients))
	// Every company is asked even when another fails, so that the sweep
	// names each one it could not read.
	// One company after another, resting after each page as long as it
	// took: a sweep reads every record of every company, and at its full
	// speed, on every core, it is a burst that delays every trip in
	// flight (BENCHMARKS.md, "One trip, hop by hop"); paced, it takes at
	// most about half a core, and only the sweep waits longer.
	errs := make([]error, len(clients))
	for i, c := range clients {
		recs, err := c.ListPaced(ctx, "", func(ctx context.Context, page time.Duration) error {
			if err := restAfterPage(ctx, page); err != nil {
				return err
			}
			return keepAlive(ctx)
		})
		if err != nil {
			errs[i] = fmt.Errorf("list %s at %s: %w", c.Resource, c.BaseURL, err)
		}
		lists[i] = recs
	}
	if err := r.readErrors(clients, errs); err != nil {
		return nil, 0, err
	}
	out := map[string]*companyRecords{}
	n := 0
	now := time.Now()
	for i, recs := range lists {
		c := clients[i]
		for _, rec := range recs {
			n++
			trip := rec.TripID()
			if why := unattributed(rec); why != "" {
				// Only one that may be in force is a finding: an undone
				// or rejected record leaves nothing to undo, so the
				// finding of a record canceled at the company closes.
				if st := rec.Status(); st != c.UndoneStatus && (c.RejectedStatus == "" || st != c.RejectedStatus) {
					addUnattributed(out, c, rec, why)
				}
				continue
			}
			cr := out[trip]
			if cr == nil {
				cr = &companyRecords{}
				out[trip] = cr
			}
			cr.of(cos[i].step)[rec.Status()]++
			if cos[i].step == r.cfg.RefundStep && rec.Status() == c.UndoneStatus {
				cr.refunded += refundedCents(rec)
			}
			if rec.Status() == c.ActiveStatus && !r.young(rec, now) {
				cr.active = append(cr.active, fmt.Sprintf("%s %s %s", c.Resource, rec.Key(), rec.Status()))
			}
		}
	}
	return out, n, nil
}

// sweepRestMax caps the rest after one page of a company's list.
const sweepRestMax = 250 * time.Millisecond

// restAfterPage waits as long as the page took (at most sweepRestMax), or
// until ctx ends.
func restAfterPage(ctx context.Context, page time.Duration) error {
	t := time.NewTimer(min(page, sweepRestMax))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// refundedCents is a refunded charge record's refunded_cents
// (providers.md, "Partial refunds"); 0 when it says none.
func refundedCents(rec provider.Record) int64 {
	switch n := rec["refunded_cents"].(type) {
	case float64:
		return int64(n)
	case json.Number:
		v, _ := n.Int64()
		return v
	}
	return 0
}

// young reports whether rec was created less than OrphanGrace ago.
func (r *Reconciler) young(rec provider.Record, now time.Time) bool {
	s, _ := rec["created_at"].(string)
	t, err := time.Parse(time.RFC3339Nano, s)
	return err == nil && now.Sub(t) < r.cfg.OrphanGrace
}

// describe renders what a trip has at the companies of cos, in their
// order: "holds held 1, charges refunded 1, bookings none".
func (c *companyRecords) describe(cos []company) string {
	if c == nil {
		c = &companyRecords{}
	}
	var parts []string
	for _, co := range cos {
		m := c.by[co.step]
		if len(m) == 0 {
			parts = append(parts, co.c.Resource+" none")
			continue
		}
		var ss []string
		for s, n := range m {
			ss = append(ss, fmt.Sprintf("%s %d", s, n))
		}
		slices.Sort(ss)
		parts = append(parts, co.c.Resource+" "+strings.Join(ss, " "))
	}
	return strings.Join(parts, ", ")
}
