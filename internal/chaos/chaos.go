// Package chaos runs the whole system under faults and audits what it left
// behind: `tripsaga chaos`. For a given time it books trips at a steady
// rate through the trips API (over every trips replica; a POST whose
// replica died is sent again with the same Idempotency-Key to another, as
// a client would), with a mix of travelers some of whom are turned down on
// purpose (car or hotel sold out, card declined), while the company
// simulators draw faults per call (sim.Rule.Chance: lost answers, hangs,
// late commits, 503s, slow answers, failing and slow undos) and a random
// instance (a service replica, or a NATS node of a cluster) is SIGKILLed
// every few seconds and restarted by the supervisor, or disrupted in
// another way of [Disruptions] (a JetStream leader stepped down, a node
// restarted with an empty store, an acked event deleted, one replica's
// network cut from PostgreSQL or NATS for a few seconds). Then it stops the
// faults and the kills, waits until the system has settled, and audits
// every trip against the companies' own records (see [Report]).
package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/schollz/progressbar/v3"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/sim"
)

// System is the running stack as the chaos run uses it; *stack.Stack
// implements it.
type System interface {
	// Instances names every supervised child process: "sim", "hotel",
	// "hotel-2", ..., "nats-1"... in a NATS cluster.
	Instances() []string
	// URLs returns the base URLs of every replica of a process.
	URLs(process string) []string
	// Kill sends SIGKILL to an instance and waits until it is dead; the
	// supervisor starts it again.
	Kill(instance string) (pid int, err error)
	// WaitReady waits until an instance answers GET /readyz with 200.
	WaitReady(ctx context.Context, instance string) error
	// CompanyURLs returns HOTEL_URL, PAYMENTS_URL, CARS_URL and MAIL_URL.
	CompanyURLs() map[string]string
}

// Config says how to run.
type Config struct {
	// Duration of the booking, faults and kills. Default 2 minutes.
	Duration time.Duration
	// Rate of bookings, trips per second. Default 5.
	Rate float64
	// KillEvery: one instance is SIGKILLed this often (the next kill waits
	// until the last victim is ready again). Default 5 s; negative: none.
	KillEvery time.Duration
	// Seed of the run's own choices (travelers, victims); 0 takes one from
	// the clock. The simulators' draws are their own.
	Seed uint64
	// SettleLimit bounds the wait for the system to settle once the faults
	// and kills stopped. Default 10 minutes.
	SettleLimit time.Duration
	// Faults armed while booking; nil: [DefaultFaults] (and
	// [InsurerFaults] with the insurance step on). Empty (not nil): none.
	Faults []Fault
	// Disruptions are the kinds drawn every KillEvery ([Disruptions]:
	// kill, step-down, empty-store, lose-acked, partition); nil: kill
	// only.
	Disruptions []string
	// NATSURL (comma-separated servers) is read for the dead letters, as
	// the identity whose seed file NATSCreds names (natsauth.Admin's).
	NATSURL   string
	NATSCreds string
	// Replicas, NATSCluster and Steps (the STEPS the system runs) are
	// only reported; the run finds the insurance step on by its insurer
	// among System.CompanyURLs (INSURER_URL).
	Replicas, NATSCluster int
	Steps                 string
	// PGHA: the system runs on a PostgreSQL pair (only reported; the
	// pg-failover kind needs a System that can fail over).
	PGHA bool
	// Progress, when set, gets a progress line: a progress bar, or with
	// ProgressPlain (not a terminal) a plain line every 10 s.
	Progress      io.Writer
	ProgressPlain bool
	// Logger; defaults to discard.
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.Duration <= 0 {
		c.Duration = 2 * time.Minute
	}
	if c.Rate <= 0 {
		c.Rate = 5
	}
	if c.KillEvery == 0 {
		c.KillEvery = 5 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.SettleLimit <= 0 {
		c.SettleLimit = 10 * time.Minute
	}
	if c.Faults == nil {
		c.Faults = DefaultFaults()
	}
	if c.Disruptions == nil {
		c.Disruptions = []string{DisruptKill}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Traveler kinds: what a trip is meant to end as without faults.
const (
	KindOK           = "ok"             // confirmed
	KindCarSoldOut   = "car_sold_out"   // canceled: refund and release (charge-last: release, the card never charged)
	KindDeclined     = "card_declined"  // canceled at the charge: release
	KindHotelSoldOut = "hotel_sold_out" // canceled at once
	// KindInsurerRejects: the insurer refuses the policy (insurance.rejected):
	// canceled, the hold released, nothing charged. Only with the insurance
	// step on, one in 14 of the ok travelers (5 % of all).
	KindInsurerRejects = "insurer_rejects"
)

// mix is the share of each kind of traveler, in percent.
var mix = []struct { //nolint:gochecknoglobals // read-only
	kind    string
	percent int
}{{KindOK, 70}, {KindCarSoldOut, 12}, {KindDeclined, 12}, {KindHotelSoldOut, 6}}

// booking is one POST /trips of the run (with its retries).
type booking struct {
	n        int
	key      string
	kind     string
	req      events.TripRequest
	tripID   string
	code     int
	attempts int
	err      string
}

type run struct {
	sys       System
	cfg       Config
	nonce     string
	trips     []string // the trips replicas' URLs
	companies map[string]string
	http      *http.Client // GETs
	// poster sends the POSTs on a new connection each: a replica killed
	// mid-request is an error this run sees and retries on another
	// replica (Go's transport would silently resend a request carrying an
	// Idempotency-Key on a reused connection, to the same replica).
	poster *http.Client

	rngMu sync.Mutex
	rng   *rand.Rand

	orphans []string // set by settle

	mu       sync.Mutex
	bookings []*booking
	kills    map[string]int
	killErrs []string
	// admin is the NATS connection of the step-down and lose-acked
	// disruptions; disrupted counts the disruptions carried out per kind,
	// lost the events deleted after their PubAck.
	admin     *disruptor
	disrupted map[string]int
	lost      []LostEvent
	// parts counts what the partitions did.
	parts PartitionStats
	// failovers are the PostgreSQL failovers made (pg-failover).
	failovers []PGFailover

	posted, answered, retried, failed, inflight atomic.Int64
}

func newRun(sys System, cfg Config) (*run, *Report, error) {
	defaultFaults := cfg.Faults == nil
	cfg.defaults()
	r := &run{
		sys: sys, cfg: cfg, nonce: strings.ToLower(ulid.Make().String()[18:]),
		trips: sys.URLs("trips"), companies: sys.CompanyURLs(),
		http:   &http.Client{Timeout: 20 * time.Second},
		poster: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)), //nolint:gosec // a test's choices, not secrets
		kills:  map[string]int{}, disrupted: map[string]int{}, parts: PartitionStats{Shapes: map[string]int{}},
	}
	if len(r.trips) == 0 {
		return nil, nil, errors.New("chaos: no trips replica")
	}
	if defaultFaults && r.insurance() {
		r.cfg.Faults = append(r.cfg.Faults, InsurerFaults()...)
	}
	rep := &Report{
		Steps: cfg.Steps, Seed: cfg.Seed, DurationS: cfg.Duration.Seconds(), Rate: cfg.Rate, KillEveryS: cfg.KillEvery.Seconds(),
		Replicas: max(cfg.Replicas, 1), NATSCluster: cfg.NATSCluster, Duplicates: map[string]int{}, Kills: map[string]int{},
		Faults: map[string]int{}, Incidents: map[string]int{}, IncidentKinds: map[string]int{}, Travelers: map[string]int{},
		DisruptionKinds: cfg.Disruptions, Disruptions: map[string]int{}, PGHA: cfg.PGHA,
	}
	return r, rep, nil
}

// Run books, injects faults and kills for cfg.Duration on sys, lets the
// system settle and audits it. The error is for a run that could not be
// made (faults not armed, no trips replica); what the run found is in the
// report ([Report.Err]).
func Run(ctx context.Context, sys System, cfg Config) (*Report, error) {
	r, rep, err := newRun(sys, cfg)
	if err != nil {
		return nil, err
	}
	cfg = r.cfg
	if slices.ContainsFunc(cfg.Disruptions, func(k string) bool { return k == DisruptStepDown || k == DisruptLoseAcked }) {
		if r.admin, err = r.connectAdmin(); err != nil {
			return nil, err
		}
		defer r.admin.nc.Close()
	}
	for _, in := range sys.Instances() {
		if killable(in) {
			rep.Victims = append(rep.Victims, in)
		}
	}

	// The business rules (the travelers who are turned down) stay for the
	// whole run; the probabilistic faults only while booking.
	if err := r.armBusiness(ctx); err != nil {
		return nil, err
	}
	armed, err := r.armFaults(ctx)
	if err != nil {
		r.disarm(context.WithoutCancel(ctx), armed, rep)
		return nil, err
	}

	start := time.Now()
	bctx, stopBooking := context.WithTimeout(ctx, cfg.Duration)
	defer stopBooking()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.bookAtRate(bctx, ctx) }()
	go func() { defer wg.Done(); r.disruptLoop(bctx, ctx, rep.Victims) }()
	r.progress(bctx, start)
	wg.Wait() // the last kill's victim is ready again

	// Faults and kills stop here; the POSTs still being retried go on.
	stopped := time.Now()
	r.disarm(context.WithoutCancel(ctx), armed, rep)
	rep.FaultsStoppedAt = stopped.UTC()
	r.waitPosts(ctx)
	r.audit(ctx, rep, stopped)
	return rep, nil
}

// audit lets the system settle after the faults stopped, audits every
// trip and fills rep.
func (r *run) audit(ctx context.Context, rep *Report, stopped time.Time) {
	audits, settled, settledAt := r.settle(ctx, stopped)
	rep.Settled = settled
	if settled {
		rep.SettleAfterFaultsMS = max(settledAt.Sub(stopped), 0).Milliseconds()
	}
	r.incidents(ctx, rep)
	rep.DeadLetters = r.deadLetters(ctx)
	r.overlaps(ctx, rep)
	r.mu.Lock()
	kills := r.kills
	rep.KillErrors = r.killErrs
	bookings := slices.Clone(r.bookings)
	lost := slices.Clone(r.lost)
	rep.PGFailovers = slices.Clone(r.failovers)
	for k, v := range r.disrupted {
		rep.Disruptions[k] = v
	}
	if slices.Contains(r.cfg.Disruptions, DisruptPartition) {
		parts := r.parts
		rep.Partitions = &parts
	}
	r.mu.Unlock()
	for k, v := range kills {
		rep.Kills[k] = v
		rep.KillsTotal += v
	}
	if len(lost) > 0 {
		rep.LostEvents = r.waitLostFound(ctx, lost)
		for _, l := range rep.LostEvents {
			if l.FoundAgain {
				rep.LostFoundAgain++
			}
		}
	}
	rep.Posts = PostStats{Posted: int(r.posted.Load()), Answered: int(r.answered.Load()), Retried: int(r.retried.Load()), Failed: int(r.failed.Load())}
	for _, b := range bookings {
		rep.Travelers[b.kind]++
		if b.err != "" && len(rep.Posts.Errors) < 10 {
			rep.Posts.Errors = append(rep.Posts.Errors, b.key+": "+b.err)
		}
	}
	rep.Orphans = r.orphans
	summarize(rep, audits, bookings)
}

// killable reports whether chaos kills an instance: any service replica
// and NATS node, never the simulators (they are the outside companies;
// their fault rules live in their memory).
func killable(instance string) bool { return instance != "sim" && !strings.HasPrefix(instance, "sim-") }

func (r *run) intn(n int) int {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return r.rng.IntN(n)
}

func (r *run) email(kind string, n int) string {
	switch kind {
	case KindCarSoldOut, KindHotelSoldOut, KindInsurerRejects:
		// One address per kind, so one rule turns them all down.
		return strings.ReplaceAll(kind, "_", "-") + "." + r.nonce + "@example.com"
	}
	return "traveler" + strconv.Itoa(n) + "." + r.nonce + "@example.com"
}

// armBusiness adds the rules that turn the sold-out travelers down (and,
// with the insurance step on, those the insurer refuses).
func (r *run) armBusiness(ctx context.Context) error {
	type rule struct {
		company string
		rule    sim.Rule
	}
	rules := []rule{
		{"CARS_URL", sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut, Match: map[string]string{"driver.email": r.email(KindCarSoldOut, 0)}}},
		{"HOTEL_URL", sim.Rule{Op: sim.OpHold, Fault: sim.FaultSoldOut, Match: map[string]string{"guest.email": r.email(KindHotelSoldOut, 0)}}},
	}
	if r.insurance() {
		rules = append(rules, rule{"INSURER_URL", sim.Rule{Op: sim.OpInsure, Fault: sim.FaultRejected, Match: map[string]string{"traveler.email": r.email(KindInsurerRejects, 0)}}})
	}
	for _, x := range rules {
		if err := sim.AddFault(ctx, r.companies[x.company], x.rule); err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
	}
	return nil
}

type armedFault struct {
	Fault
	id string
}

func (r *run) armFaults(ctx context.Context) ([]armedFault, error) {
	var out []armedFault
	for _, f := range r.cfg.Faults {
		base, ok := r.companies[f.Company]
		if !ok {
			return out, fmt.Errorf("chaos: fault %s: no company %s", f.Name(), f.Company)
		}
		rule, err := sim.AddFaultRule(ctx, base, f.Rule)
		if err != nil {
			return out, fmt.Errorf("chaos: fault %s: %w", f.Name(), err)
		}
		out = append(out, armedFault{Fault: f, id: rule.ID})
	}
	return out, nil
}

// disarm removes the probabilistic faults and counts how often each was
// drawn.
func (r *run) disarm(ctx context.Context, armed []armedFault, rep *Report) {
	for _, a := range armed {
		var rule sim.Rule
		var err error
		for try := 0; try < 5; try++ {
			if rule, err = sim.RemoveFault(ctx, r.companies[a.Company], a.id); err == nil {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if err != nil {
			rep.Problems = append(rep.Problems, "could not remove fault "+a.Name()+": "+err.Error())
			continue
		}
		rep.Faults[a.Name()] += rule.Applied
		rep.FaultsTotal += rule.Applied
	}
}

// bookAtRate starts one booking every 1/Rate s until bctx ends; each goes
// on (retries included) under ctx.
func (r *run) bookAtRate(bctx, ctx context.Context) {
	t := time.NewTicker(time.Duration(float64(time.Second) / r.cfg.Rate))
	defer t.Stop()
	for n := 1; ; n++ {
		b := r.newBooking(n)
		r.mu.Lock()
		r.bookings = append(r.bookings, b)
		r.mu.Unlock()
		r.inflight.Add(1)
		go func() {
			defer r.inflight.Add(-1)
			r.book(ctx, b)
		}()
		select {
		case <-bctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *run) newBooking(n int) *booking {
	p := r.intn(100)
	kind := mix[0].kind
	for _, m := range mix {
		if p < m.percent {
			kind = m.kind
			break
		}
		p -= m.percent
	}
	if kind == KindOK && r.insurance() && r.intn(14) == 0 {
		kind = KindInsurerRejects
	}
	card := "tok_chaos_" + r.nonce + "_" + strconv.Itoa(n)
	if kind == KindDeclined {
		card = sim.DeclinedCardToken
	}
	in := time.Now().UTC().AddDate(0, 0, 30)
	return &booking{
		n: n, key: "chaos-" + r.nonce + "-" + strconv.Itoa(n), kind: kind,
		req: events.TripRequest{
			Traveler: events.Person{Name: "Chaos Traveler " + r.nonce + " " + strconv.Itoa(n), Email: r.email(kind, n)},
			Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: in.Format(time.DateOnly), Nights: 2},
			Car:      events.CarRequest{CarClass: "compact", Pickup: in.Format(time.DateOnly), Return: in.AddDate(0, 0, 2).Format(time.DateOnly)},
			Payment:  events.PaymentRequest{CardToken: card, AmountCents: 33000, Currency: "USD"},
		},
	}
}

// book POSTs the trip, to replica n first; a connection error or a 5xx
// sends the same request with the same Idempotency-Key to the next
// replica, backing off, for at most two minutes.
func (r *run) book(ctx context.Context, b *booking) {
	r.posted.Add(1)
	body, _ := json.Marshal(b.req)
	deadline := time.Now().Add(2 * time.Minute)
	wait := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		u := r.trips[(b.n+attempt)%len(r.trips)] + "/trips"
		b.attempts++
		code, raw, err := r.post(ctx, u, b.key, body)
		if err == nil && (code == http.StatusCreated || code == http.StatusAccepted) {
			var a struct {
				TripID string `json:"trip_id"`
			}
			if err := json.Unmarshal(raw, &a); err == nil && a.TripID != "" {
				r.mu.Lock()
				b.tripID, b.code = a.TripID, code
				r.mu.Unlock()
				r.answered.Add(1)
				if attempt > 0 {
					r.retried.Add(1)
				}
				return
			}
			err = fmt.Errorf("answer without trip_id: %s", raw)
		}
		if err == nil && code < 500 && code != http.StatusTooManyRequests {
			// 400, 409: the API refused the request itself; no retry helps.
			r.mu.Lock()
			b.code, b.err = code, fmt.Sprintf("%d %s", code, bytes.TrimSpace(raw))
			r.mu.Unlock()
			r.failed.Add(1)
			return
		}
		if err == nil {
			err = fmt.Errorf("%d %s", code, bytes.TrimSpace(raw))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			r.mu.Lock()
			b.err = fmt.Sprintf("no answer after %d attempts: %v", b.attempts, err)
			r.mu.Unlock()
			r.failed.Add(1)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

func (r *run) post(ctx context.Context, u, key string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Prefer", "wait=2")
	resp, err := r.poster.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, raw, err
}

// waitPosts waits for the POSTs still being retried (each gives up after
// two minutes).
func (r *run) waitPosts(ctx context.Context) {
	for r.inflight.Load() > 0 && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
}

// disruptLoop carries out a disruption every KillEvery until bctx ends,
// each after the one before is over (a killed instance is ready again):
// the kinds of Config.Disruptions take turns from a random one, so every
// kind happens in a run of a few of them; victims are drawn at random.
func (r *run) disruptLoop(bctx, ctx context.Context, victims []string) {
	if r.cfg.KillEvery < 0 || len(victims) == 0 || len(r.cfg.Disruptions) == 0 {
		return
	}
	t := time.NewTicker(r.cfg.KillEvery)
	defer t.Stop()
	for turn := r.intn(len(r.cfg.Disruptions)); ; turn++ {
		select {
		case <-bctx.Done():
			return
		case <-t.C:
		}
		kind := r.cfg.Disruptions[turn%len(r.cfg.Disruptions)]
		what, err := r.disrupt(ctx, kind, victims)
		r.mu.Lock()
		if err != nil {
			r.killErrs = append(r.killErrs, kind+": "+what+": "+firstLine(err.Error()))
		} else {
			r.disrupted[kind]++
		}
		r.mu.Unlock()
		r.cfg.Logger.Info("chaos: disruption", "kind", kind, "what", what, "err", err)
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// progress draws the progress line until bctx ends.
func (r *run) progress(bctx context.Context, start time.Time) {
	p := r.newProgress(int64(r.cfg.Duration / time.Second))
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-bctx.Done():
			p.finish()
			return
		case <-t.C:
		}
		r.mu.Lock()
		kills := 0
		for _, n := range r.disrupted {
			kills += n
		}
		r.mu.Unlock()
		p.show(fmt.Sprintf("chaos: %d booked, %d answered, %d retried elsewhere, %d in flight, %d disruptions",
			r.posted.Load(), r.answered.Load(), r.retried.Load(), r.inflight.Load(), kills), int64(time.Since(start)/time.Second))
	}
}

// progressLine is the progress line: a progress bar (a spinner when max
// is -1) on a terminal, a plain line every 10 s elsewhere, nothing
// without Config.Progress.
type progressLine struct {
	w     io.Writer
	bar   *progressbar.ProgressBar
	start time.Time
	last  time.Time
}

func (r *run) newProgress(maxValue int64) *progressLine {
	p := &progressLine{w: r.cfg.Progress, start: time.Now(), last: time.Now()}
	if p.w != nil && !r.cfg.ProgressPlain {
		opts := []progressbar.Option{
			progressbar.OptionSetWriter(p.w), progressbar.OptionSetElapsedTime(true), progressbar.OptionSetPredictTime(false),
			progressbar.OptionThrottle(200 * time.Millisecond), progressbar.OptionClearOnFinish(),
		}
		if maxValue < 0 {
			opts = append(opts, progressbar.OptionSpinnerType(14))
		} else {
			opts = append(opts, progressbar.OptionSetWidth(20))
		}
		p.bar = progressbar.NewOptions64(maxValue, opts...)
	}
	return p
}

func (p *progressLine) show(desc string, n int64) {
	switch {
	case p.bar != nil:
		p.bar.Describe(desc)
		if n < 0 {
			_ = p.bar.Add(1)
		} else {
			_ = p.bar.Set64(n)
		}
	case p.w != nil && time.Since(p.last) >= 10*time.Second:
		p.last = time.Now()
		fmt.Fprintf(p.w, "%s [%s]\n", desc, time.Since(p.start).Round(time.Second))
	}
}

func (p *progressLine) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

// overlaps reads every company's count of writes made while another write
// of the same key was in flight (sim's GET <company>/_stats).
func (r *run) overlaps(ctx context.Context, rep *Report) {
	rep.OverlappingCalls = map[string]int64{}
	for v, base := range r.companies {
		name := strings.ToLower(strings.TrimSuffix(v, "_URL"))
		st, err := sim.GetStats(ctx, base)
		if err != nil {
			rep.OverlappingCalls[name] = -1
			rep.Problems = append(rep.Problems, fmt.Sprintf("overlapping calls of %s unknown: %v", name, err))
			continue
		}
		rep.OverlappingCalls[name] = st.OverlappingCalls
		rep.OverlappingCallsTotal += st.OverlappingCalls
	}
}
