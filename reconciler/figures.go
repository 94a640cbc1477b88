package reconciler

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
)

// The figures the reconciler adds to Prometheus. Trips by status, open
// findings, open incidents, consumer lag and dead letters are exported
// already (tripsaga_reconciler_trips, tripsaga_reconciler_findings, and
// each service's tripsaga_incidents_open, tripsaga_inbox_consumer_*,
// tripsaga_deadletter_messages); the dashboard reads those from the
// services' /metrics rather than counting them twice.
var (
	descUnfinished = prometheus.NewDesc("tripsaga_reconciler_unfinished_trips", //nolint:gochecknoglobals // read-only declaration
		"Trips in the projection not settled by a trip.confirmed or trip.canceled event.", nil, nil)
	descOldestUnfinished = prometheus.NewDesc("tripsaga_reconciler_oldest_unfinished_age_seconds", //nolint:gochecknoglobals // read-only declaration
		"Age of the oldest unfinished trip, from its first event (0 when none).", nil, nil)
	descHalfLastDay = prometheus.NewDesc("tripsaga_reconciler_half_trips_last_day", //nolint:gochecknoglobals // read-only declaration
		"Half trips the sweep first found in the last 24 hours (resolved ones too).", nil, nil)
)

// chartWindow is how far back the dashboard's chart and answer-time
// percentiles reach.
const chartWindow = time.Hour

// sampleEvery is how often the number of unfinished trips is sampled for
// the chart.
const sampleEvery = 15 * time.Second

// figures holds what the reconciler measures itself: the time from each
// trip's request to its final answer, as the projection applies the
// settling event, and samples of the unfinished trips, for the last hour.
type figures struct {
	answer prometheus.Histogram
	mu     sync.Mutex
	// answers are (settling event time, request-to-answer duration).
	answers []sample
	// unfinished are (sample time, trips).
	unfinished []sample
}

type sample struct {
	at time.Time
	v  float64
}

func newFigures(reg prometheus.Registerer, r *Reconciler) (*figures, error) {
	f := &figures{answer: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tripsaga_reconciler_answer_seconds",
		Help:    "Time from a trip's trip.requested to its trip.confirmed or trip.canceled (the events' own times), as the live projection applies the settling event.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
	})}
	if reg != nil {
		for _, c := range []prometheus.Collector{f.answer, figureCollector{r}} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

func (f *figures) add(list *[]sample, s sample) {
	f.mu.Lock()
	defer f.mu.Unlock()
	*list = append(*list, s)
	cut := time.Now().Add(-chartWindow)
	i := 0
	for i < len(*list) && (*list)[i].at.Before(cut) {
		i++
	}
	*list = slices.Delete(*list, 0, i)
}

func (f *figures) snapshot() (answers, unfinished []sample) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cut := time.Now().Add(-chartWindow)
	keep := func(s sample) bool { return s.at.Before(cut) }
	return slices.DeleteFunc(slices.Clone(f.answers), keep), slices.DeleteFunc(slices.Clone(f.unfinished), keep)
}

// observeSettled records the answer time of each settling event of es in
// the histogram and the chart; the trip's row in tx gives its request time
// (its first event). Called after the events were applied in tx. A
// transaction that then rolls back and is tried again counts twice; that
// is rare and only moves a percentile.
func (r *Reconciler) observeSettled(ctx context.Context, tx pgx.Tx, es []event.Event) {
	for _, e := range es {
		if e.Type() != events.TripConfirmed && e.Type() != events.TripCanceled || e.Time().IsZero() {
			continue
		}
		row, err := queries.TripViewGet(ctx, tx, e.Subject())
		if err != nil || !row.Requested {
			continue
		}
		d := e.Time().Sub(row.FirstEventAt)
		if d < 0 {
			continue
		}
		r.figures.answer.Observe(d.Seconds())
		r.figures.add(&r.figures.answers, sample{e.Time().UTC(), d.Seconds()})
	}
}

// observing wraps the live projection's handlers with [Reconciler.observeSettled].
func (r *Reconciler) observing(h inbox.HandlerFunc, b inbox.BatchFunc) (inbox.HandlerFunc, inbox.BatchFunc) {
	return func(ctx context.Context, tx pgx.Tx, e event.Event) error {
			if err := h(ctx, tx, e); err != nil {
				return err
			}
			r.observeSettled(ctx, tx, []event.Event{e})
			return nil
		}, func(ctx context.Context, tx pgx.Tx, consumer string, ds []inbox.Delivery) error {
			if err := b(ctx, tx, consumer, ds); err != nil {
				return err
			}
			es := make([]event.Event, 0, len(ds))
			for _, d := range ds {
				es = append(es, d.Event)
			}
			r.observeSettled(ctx, tx, es)
			return nil
		}
}

// sampleUnfinished samples the unfinished trips every 15 s for the chart
// until ctx ends.
func (r *Reconciler) sampleUnfinished(ctx context.Context) error {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		if row, err := queries.TripViewUnfinished(ctx, r.cfg.Pool); err == nil {
			r.figures.add(&r.figures.unfinished, sample{time.Now().UTC(), float64(row.Trips)})
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// figureCollector exports the unfinished trips, the oldest one's age and
// the half trips of the last day, read from the tables at each scrape.
type figureCollector struct{ r *Reconciler }

func (c figureCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descUnfinished
	ch <- descOldestUnfinished
	ch <- descHalfLastDay
}

func (c figureCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if row, err := queries.TripViewUnfinished(ctx, c.r.cfg.Pool); err == nil {
		ch <- prometheus.MustNewConstMetric(descUnfinished, prometheus.GaugeValue, float64(row.Trips))
		ch <- prometheus.MustNewConstMetric(descOldestUnfinished, prometheus.GaugeValue, max(row.OldestAgeSeconds, 0))
	}
	if rows, err := queries.FindingHalfPerDay(ctx, c.r.cfg.Pool, time.Now().Add(-24*time.Hour)); err == nil {
		n := int64(0)
		for _, row := range rows {
			n += row.Trips
		}
		ch <- prometheus.MustNewConstMetric(descHalfLastDay, prometheus.GaugeValue, float64(n))
	}
}

// Figures are the dashboard's numbers.
type Figures struct {
	At time.Time `json:"at"`
	// Unfinished is the number of trips not settled; OldestUnfinished the
	// oldest of them and its age from its first event.
	Unfinished          int           `json:"unfinished"`
	OldestUnfinished    string        `json:"oldest_unfinished,omitempty"`
	OldestUnfinishedAge time.Duration `json:"oldest_unfinished_age_ns"`
	// HalfPerDay counts the half trips the sweep first found each UTC day
	// of the last seven.
	HalfPerDay []DayCount `json:"half_per_day"`
	// Answers are the request-to-answer times of the trips settled in the
	// last hour, as this process applied them.
	Answers AnswerTimes `json:"answers"`
	// UndoAttempts is the undo calls the step services made to the
	// companies since they started (tripsaga_step_calls_total{op="undo"}),
	// by outcome.
	UndoAttempts map[string]float64 `json:"undo_attempts"`
	// IncidentsOpen and DeadLetters sum the services' own gauges
	// (tripsaga_incidents_open, tripsaga_deadletter_messages).
	IncidentsOpen int `json:"incidents_open"`
	DeadLetters   int `json:"dead_letters"`
	// Consumers is each durable consumer's lag.
	Consumers []ConsumerLag `json:"consumers"`
	// Unread names the services whose /metrics could not be read.
	Unread []string `json:"unread,omitempty"`
	// Rebuild, when set, is a rebuild of the view (tripsaga replay
	// reconciler) under way or left half-way: Unfinished and the findings
	// are incomplete until one finishes.
	Rebuild *RebuildState `json:"rebuild,omitempty"`
}

// RebuildState is a rebuild of the view that has not finished: Since is
// when its clear committed; Running says a replay holds the replay lock
// now (false: it stopped half-way, killed or failed, and `tripsaga replay
// reconciler` must run again to finish it).
type RebuildState struct {
	Since   time.Time `json:"since"`
	Running bool      `json:"running"`
}

// rebuildState returns the unfinished rebuild of the view, or nil.
func (r *Reconciler) rebuildState(ctx context.Context) (*RebuildState, error) {
	since, err := queries.RebuildUnfinished(ctx, r.cfg.Pool, ProjectionName)
	if err != nil || len(since) == 0 {
		return nil, err
	}
	st := &RebuildState{Since: since[0].UTC()}
	tx, err := r.cfg.Pool.Begin(ctx)
	if err != nil {
		return st, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	idle, err := queries.SweepTryLockShared(ctx, tx)
	st.Running = err == nil && !idle
	return st, err
}

// DayCount is a number for one UTC day ("2026-11-30").
type DayCount struct {
	Day   string `json:"day"`
	Count int    `json:"count"`
}

// AnswerTimes are percentiles of request-to-answer times.
type AnswerTimes struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P95 time.Duration `json:"p95_ns"`
	P99 time.Duration `json:"p99_ns"`
}

// ConsumerLag is one durable consumer's lag as its service exports it.
type ConsumerLag struct {
	Service    string  `json:"service"`
	Consumer   string  `json:"consumer"`
	Stream     string  `json:"stream"`
	Pending    float64 `json:"pending"`
	AckPending float64 `json:"ack_pending"`
	// OldestAge is the age of the oldest event not acknowledged, in
	// seconds.
	OldestAge float64 `json:"oldest_age_seconds"`
}

// Figures gathers the dashboard's numbers: the tables, this process's
// measurements, and every service's /metrics ([Config.Services]) plus
// this process's own registry.
func (r *Reconciler) Figures(ctx context.Context) (Figures, error) {
	f := Figures{At: time.Now().UTC(), HalfPerDay: []DayCount{}, UndoAttempts: map[string]float64{}, Consumers: []ConsumerLag{}}
	row, err := queries.TripViewUnfinished(ctx, r.cfg.Pool)
	if err != nil {
		return f, fmt.Errorf("figures: unfinished: %w", err)
	}
	f.Unfinished, f.OldestUnfinished = int(row.Trips), row.OldestTrip
	if f.Rebuild, err = r.rebuildState(ctx); err != nil {
		return f, fmt.Errorf("figures: rebuild: %w", err)
	}
	f.OldestUnfinishedAge = time.Duration(row.OldestAgeSeconds * float64(time.Second)).Round(time.Second)
	days, err := queries.FindingHalfPerDay(ctx, r.cfg.Pool, time.Now().UTC().Truncate(24*time.Hour).Add(-6*24*time.Hour))
	if err != nil {
		return f, fmt.Errorf("figures: half per day: %w", err)
	}
	got := map[string]int{}
	for _, d := range days {
		got[d.Day[:min(10, len(d.Day))]] = int(d.Trips)
	}
	for i := 6; i >= 0; i-- {
		day := f.At.Add(-time.Duration(i) * 24 * time.Hour).Format(time.DateOnly)
		f.HalfPerDay = append(f.HalfPerDay, DayCount{day, got[day]})
	}
	answers, _ := r.figures.snapshot()
	f.Answers = percentiles(answers)

	families := map[string][]*dto.MetricFamily{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, base := range r.cfg.Services {
		wg.Go(func() {
			fams, err := scrape(ctx, base+"/metrics")
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				f.Unread = append(f.Unread, name+": "+err.Error())
				return
			}
			families[name] = fams
		})
	}
	wg.Wait()
	if g, ok := r.cfg.Registerer.(prometheus.Gatherer); ok {
		if fams, err := g.Gather(); err == nil {
			families["reconciler"] = fams
		}
	}
	lags := map[[3]string]*ConsumerLag{}
	for service, fams := range families {
		for _, fam := range fams {
			for _, m := range fam.GetMetric() {
				l := labels(m)
				v := m.GetGauge().GetValue()
				switch fam.GetName() {
				case "tripsaga_step_calls_total":
					if l["op"] == "undo" {
						f.UndoAttempts[l["outcome"]] += m.GetCounter().GetValue()
					}
				case "tripsaga_incidents_open":
					f.IncidentsOpen += int(v)
				case "tripsaga_deadletter_messages":
					f.DeadLetters += int(v)
				case "tripsaga_inbox_consumer_pending", "tripsaga_inbox_consumer_ack_pending", "tripsaga_inbox_consumer_oldest_pending_age_seconds":
					k := [3]string{service, l["consumer"], l["stream"]}
					c := lags[k]
					if c == nil {
						c = &ConsumerLag{Service: service, Consumer: l["consumer"], Stream: l["stream"]}
						lags[k] = c
					}
					switch fam.GetName() {
					case "tripsaga_inbox_consumer_pending":
						c.Pending = v
					case "tripsaga_inbox_consumer_ack_pending":
						c.AckPending = v
					default:
						c.OldestAge = v
					}
				}
			}
		}
	}
	for _, c := range lags {
		f.Consumers = append(f.Consumers, *c)
	}
	slices.SortFunc(f.Consumers, func(a, b ConsumerLag) int {
		return strings.Compare(a.Service+"/"+a.Consumer+"/"+a.Stream, b.Service+"/"+b.Consumer+"/"+b.Stream)
	})
	sort.Strings(f.Unread)
	return f, nil
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

// scrape reads a Prometheus text exposition.
func scrape(ctx context.Context, u string) ([]*dto.MetricFamily, error) {
	req, err := httpGet(ctx, u)
	if err != nil {
		return nil, err
	}
	defer req.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(req.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		out = append(out, f)
	}
	return out, nil
}

// percentiles are the nearest-rank p50, p95 and p99 of samples (seconds).
func percentiles(ss []sample) AnswerTimes {
	if len(ss) == 0 {
		return AnswerTimes{}
	}
	vs := make([]float64, len(ss))
	for i, s := range ss {
		vs[i] = s.v
	}
	slices.Sort(vs)
	at := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(vs)))) - 1
		return time.Duration(vs[max(0, min(i, len(vs)-1))] * float64(time.Second)).Round(time.Millisecond)
	}
	return AnswerTimes{N: len(vs), P50: at(.50), P95: at(.95), P99: at(.99)}
}
