// Package bench measures the whole system and, in the same run, the limits
// of the machine it runs on: `tripsaga bench`.
//
// On a private durable PostgreSQL cluster (fsync and synchronous_commit on,
// pg_stat_statements loaded) and the stack's embedded NATS server it
// measures two baselines: saga-step-shaped transactions per second (an
// inbox insert, a row update and an outbox insert, then commit, from 16
// connections) and JetStream asynchronous publishes per second (512 B).
// Then it books trips through the whole system: closed loops (clients that
// book one trip after another) give the maximum trips/s with every trip
// confirmed and nothing left pending; open loops at shares of that maximum
// give the answer time percentiles at a fixed offered rate. For the best
// closed loop it reports PostgreSQL transactions and statements per trip,
// CPU ms per trip of every process, and the reconciler's lag. Last, on a
// scratch schema and a second embedded NATS server (so that their events
// reach no service), it measures the outbox relay and the reconciler's
// rebuild with the outbox and reconciler packages' own code. Every figure
// is also printed as a ratio to the baselines of the same run.
package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/natssync"
	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/pgroles"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/natsauth"
)

// Config says what to measure. Zero sizes take the defaults of the
// `tripsaga bench` flags.
type Config struct {
	// Dir holds the cluster, the NATS stores and the logs. Required unless
	// TripsURL is set.
	Dir string
	// Binary is the tripsaga executable that runs the stack; defaults to
	// the running executable.
	Binary string
	// TripsURL, when set, books trips on that running system and measures
	// only the load (no baselines, no per-trip costs, no relay, no rebuild).
	TripsURL string
	// Trips booked by each closed loop.
	Trips int
	// Concurrency: one closed loop per value, clients booking at once.
	Concurrency []int
	// OpenPercents: one open loop per value, offered at that share (%) of
	// the best closed loop's trips/s, for OpenSeconds (s).
	OpenPercents []int
	OpenSeconds  float64
	// BaselineASeconds and BaselineBSeconds: how long each baseline runs, s.
	BaselineASeconds, BaselineBSeconds float64
	// RelayEvents is the outbox backlog drained; RebuildEvents the smaller
	// of the two rebuilds (the other has twice as many).
	RelayEvents, RebuildEvents int
	// SimMemory runs the company simulators with their records in memory.
	SimMemory bool
	// Progress, when set, receives progress bars (a terminal).
	Progress io.Writer
	// Logger reports the phases. Defaults to discard.
	Logger *slog.Logger
	// Peer, when set (one of [Peers]), also measures that peer in the same
	// run, after our own figures: the same trip saga written with another
	// library (bench/peers/<name>, its own Go module, built with go build),
	// on the same cluster, at the same Concurrency and Trips.
	Peer string
	// PeerDir is the peer's module folder; defaults to bench/peers/<Peer>
	// in the working folder or above it.
	PeerDir string
	// Replicas, when set, adds the scaling curve (scaling.go): the system
	// started afresh with that many replicas of every service, for each
	// value, on each of NATSNodes (1: the one embedded server; 3: a
	// three-node JetStream cluster, streams replicated three times).
	Replicas  []int
	NATSNodes []int
}

// Validate refuses sizes that cannot run; errors wrap [ErrBadFlag].
func (c Config) Validate() error {
	switch {
	case c.Trips < 1:
		return fmt.Errorf("%w: --trips %d: want at least 1", ErrBadFlag, c.Trips)
	case len(c.Concurrency) == 0:
		return fmt.Errorf("%w: --concurrency: want at least one value", ErrBadFlag)
	case c.OpenSeconds < 0 || c.BaselineASeconds <= 0 || c.BaselineBSeconds <= 0:
		return fmt.Errorf("%w: durations must be positive", ErrBadFlag)
	case c.TripsURL == "" && (c.RelayEvents < 1 || c.RebuildEvents < 5):
		return fmt.Errorf("%w: --relay-events must be at least 1 and --rebuild-events at least 5", ErrBadFlag)
	}
	for _, n := range c.Concurrency {
		if n < 1 {
			return fmt.Errorf("%w: --concurrency %d: want at least 1 client", ErrBadFlag, n)
		}
	}
	for _, p := range c.OpenPercents {
		if p < 1 || p > 100 {
			return fmt.Errorf("%w: --open %d: want a share from 1 to 100 %%", ErrBadFlag, p)
		}
	}
	if c.TripsURL != "" {
		if _, err := CheckURL("--trips-url", c.TripsURL); err != nil {
			return err
		}
	}
	if c.Peer != "" && !slices.Contains(Peers, c.Peer) {
		return fmt.Errorf("%w: --peer %q: want one of %v", ErrBadFlag, c.Peer, Peers)
	}
	for _, r := range c.Replicas {
		if r < 1 || r > 8 {
			return fmt.Errorf("%w: --replicas %d: want 1 to 8 replicas of every service", ErrBadFlag, r)
		}
	}
	for _, n := range c.NATSNodes {
		if n != 1 && n != 3 && n != 5 {
			return fmt.Errorf("%w: --nats-nodes %d: want 1, 3 or 5 NATS servers", ErrBadFlag, n)
		}
	}
	if len(c.Replicas) > 0 && c.TripsURL != "" {
		return fmt.Errorf("%w: --replicas starts systems of its own: not with --trips-url", ErrBadFlag)
	}
	if c.Peer != "" && c.TripsURL != "" {
		return fmt.Errorf("%w: --peer needs the bench's own cluster: not with --trips-url", ErrBadFlag)
	}
	return nil
}

// Machine is what the bench ran on.
type Machine struct {
	CPUs     int     `json:"cpus"`
	CPUModel string  `json:"cpu_model,omitempty"`
	MemoryGB float64 `json:"memory_gb,omitempty"`
	Kernel   string  `json:"kernel,omitempty"`
	// LoadAvg is /proc/loadavg's 1, 5 and 15 minute load at the start.
	LoadAvg   string `json:"load_avg_at_start,omitempty"`
	GoVersion string `json:"go_version"`
	NATS      string `json:"nats_server_version"`
}

// ProcessCPU is the CPU time of one process (or group) during the best
// closed loop, ms per trip.
type ProcessCPU struct {
	Process   string  `json:"process"`
	MSPerTrip float64 `json:"ms_per_trip"`
	// IdleMSPerS is what it used per second while no trip ran, ms/s.
	IdleMSPerS float64 `json:"idle_ms_per_s"`
}

// Ratio is one figure relative to another of the same run.
type Ratio struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Target string  `json:"target,omitempty"`
}

// Report is everything one bench run measured. Rates are per second, times
// in ms unless the name says s.
type Report struct {
	Started   time.Time `json:"started"`
	DurationS float64   `json:"duration_s"`
	Machine   Machine   `json:"machine"`
	// Mode is "full" (the bench started the system) or "external"
	// (--trips-url: load figures only).
	Mode string `json:"mode"`
	// Postgres are the settings of the cluster under test.
	Postgres []Setting `json:"postgres_settings,omitempty"`
	// SimStore says where the company simulators kept their records:
	// "memory", "postgresql", or "unknown" on an external system.
	SimStore string `json:"sim_store"`
	// NATSNote says which NATS server each phase used and how its CPU is
	// attributed.
	NATSNote string `json:"nats_note,omitempty"`

	SagaStepTPS   float64 `json:"saga_step_tps"`
	JSPublishPerS float64 `json:"js_publish_per_s"`

	// WarmupTrips were booked (and settled) before the first measured run.
	WarmupTrips int `json:"warmup_trips"`
	// TripsPerS is the best closed loop's confirmed trips/s.
	TripsPerS  float64   `json:"trips_per_s"`
	ClosedLoop []LoadRun `json:"closed_loop"`
	OpenLoop   []LoadRun `json:"open_loop"`

	PGTransactionsPerTrip float64 `json:"pg_transactions_per_trip"`
	PGStatementsPerTrip   float64 `json:"pg_statements_per_trip"`
	// PGStatementsPerTripNoTxControl leaves out BEGIN/COMMIT/ROLLBACK.
	PGStatementsPerTripNoTxControl float64 `json:"pg_statements_per_trip_without_begin_commit"`
	// PGIdleTransactionsPerS: the database's transactions per second while
	// no trip ran (polling), tx/s; included in the per-trip figures.
	PGIdleTransactionsPerS float64      `json:"pg_idle_transactions_per_s"`
	TopStatements          []Statement  `json:"top_statements,omitempty"`
	CPU                    []ProcessCPU `json:"cpu"`
	CPUMSPerTrip           float64      `json:"cpu_ms_per_trip_total"`
	ReconcilerLag          Lag          `json:"reconciler_lag"`
	// Hops is where the trips of the first closed loop that settled (the
	// first --concurrency value, unless it did not settle) spent their
	// time, hop by hop; nil when not measured (--trips-url).
	Hops *Hops `json:"hops,omitempty"`

	Relay RelayResult `json:"relay"`
	// Sync is the cost of the store's sync policy and of the outbox's
	// verify (scratch servers), nil when not measured.
	Sync              *SyncResult  `json:"sync,omitempty"`
	RelayEventsPerS   float64      `json:"relay_events_per_s"`
	Rebuild           []RebuildRun `json:"rebuild"`
	RebuildEventsPerS float64      `json:"rebuild_events_per_s"`
	// RebuildTimeRatio is the time of the 2n rebuild over the n one; at
	// most 2.2 is linear enough.
	RebuildTimeRatio float64 `json:"rebuild_time_ratio"`
	RebuildLinear    bool    `json:"rebuild_linear"`

	// Peer is the peer's figures (--peer), nil without one.
	Peer *PeerReport `json:"peer,omitempty"`
	// Scaling is the scaling curve (Config.Replicas), one point per
	// replicas and NATS nodes.
	Scaling []ScalePoint `json:"scaling,omitempty"`

	Ratios []Ratio `json:"ratios"`
	// Settled is true when every run's trips were all confirmed and
	// nothing was left pending.
	Settled bool     `json:"settled"`
	Notes   []string `json:"notes,omitempty"`

	samples []timedSample
}

// timedSample is an answer for the run charts, seconds since the first load.
type timedSample struct {
	t, ms float64
	run   string
}

// ErrUnsettled is returned by [Run] (with the report) when a run left a
// trip unconfirmed or pending.
var ErrUnsettled = errors.New("bench: not every trip was confirmed and settled")

// Run measures what cfg asks and returns the report. It returns
// [ErrUnsettled] together with a complete report when a trip did not end
// confirmed.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	rep := &Report{Started: time.Now().UTC(), Machine: machineInfo(), Mode: "full", SimStore: "postgresql", Settled: true}
	rep.Machine.GoVersion = runtime.Version()
	rep.Machine.NATS = server.VERSION
	if cfg.SimMemory {
		rep.SimStore = "memory"
	} else if cfg.TripsURL == "" {
		rep.Notes = append(rep.Notes, "the simulators keep their records in the same PostgreSQL: the per-trip PostgreSQL figures include their transactions (--sim-memory leaves them out)")
	}
	var err error
	if cfg.TripsURL != "" {
		rep.Mode, rep.SimStore = "external", "unknown"
		err = runExternal(ctx, cfg, rep)
	} else {
		err = runFull(ctx, cfg, rep)
	}
	rep.DurationS = round(time.Since(rep.Started).Seconds(), 1)
	rep.ratios()
	if err != nil {
		return rep, err
	}
	if !rep.Settled {
		return rep, ErrUnsettled
	}
	return rep, nil
}

func runExternal(ctx context.Context, cfg Config, rep *Report) error {
	u, _ := CheckURL("--trips-url", cfg.TripsURL)
	l := newLoader(u, cfg.Progress)
	return loadPhases(ctx, cfg, rep, l, nil)
}

// stackInfo is what the stack child prints once ready.
type stackInfo struct {
	NATSURL string `json:"nats_url"`
	// NATSCreds is the seed file of natsauth.Admin, which baseline B
	// connects as.
	NATSCreds string            `json:"nats_creds"`
	Addr      map[string]string `json:"addr"`
	// Trips is the base URL of every replica of the trips service.
	Trips []string `json:"trips"`
}

func runFull(ctx context.Context, cfg Config, rep *Report) error {
	if cfg.Dir == "" {
		return fmt.Errorf("%w: Dir is required", ErrBadFlag)
	}
	log := cfg.Logger
	// Build the peer first: a peer that does not build fails the run
	// before minutes of measuring.
	var peerBin, peerLib string
	if cfg.Peer != "" {
		log.Info("bench: building the peer", "peer", cfg.Peer)
		var err error
		if peerBin, peerLib, err = buildPeer(ctx, cfg, filepath.Join(cfg.Dir, "peer-"+cfg.Peer)); err != nil {
			return err
		}
	}
	log.Info("bench: starting PostgreSQL (durable, pg_stat_statements)")
	pgDir := filepath.Join(cfg.Dir, "pg")
	pg, err := pgcluster.Start(ctx, pgcluster.Config{Dir: pgDir, Durable: true, Settings: map[string]string{
		"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top",
	}})
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer func() {
		if err := pg.Stop(); err != nil {
			log.Error("bench: stop PostgreSQL", "err", err)
		}
	}()
	pmPid, err := postmasterPid(filepath.Join(pgDir, "data"))
	if err != nil {
		return err
	}
	admin, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	// The cluster asks every role for its password: the monitoring role
	// gets a new one each run.
	monPW := pgroles.NewPassword()
	for _, q := range []string{
		"CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
		"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '" + benchRole + "') THEN CREATE ROLE " + benchRole + " LOGIN SUPERUSER; END IF; END $$",
		"ALTER ROLE " + benchRole + " PASSWORD '" + monPW + "'",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			admin.Close(ctx)
			return fmt.Errorf("bench: %s: %w", strings.Replace(q, monPW, "xxxxx", 1), err)
		}
	}
	var hasDB bool
	_ = admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = 'bench')").Scan(&hasDB)
	if !hasDB {
		if _, err := admin.Exec(ctx, "CREATE DATABASE bench"); err != nil {
			admin.Close(ctx)
			return fmt.Errorf("bench: create database: %w", err)
		}
	}
	admin.Close(ctx)
	benchURL, err := withDB(pg.URL, "bench", "", "")
	if err != nil {
		return err
	}
	monURL, err := withDB(pg.URL, "postgres", benchRole, monPW)
	if err != nil {
		return err
	}
	mconn, err := pgx.Connect(ctx, monURL)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer mconn.Close(context.Background())
	pm := &pgMeter{conn: mconn, db: "postgres"}
	if rep.Postgres, err = pm.settings(ctx); err != nil {
		return err
	}

	log.Info("bench: starting the system", "sim_store", rep.SimStore)
	child, info, err := startStack(ctx, cfg, pg.URL, stackShape{})
	if err != nil {
		return err
	}
	defer child.stop()
	rep.NATSNote = "trips, baseline B: the stack's embedded NATS server, which runs in the stack process with the supervisor (its CPU is row " + procNATS + "); relay and rebuild: a second embedded NATS server in the bench process, same options, so their events reach no service"
	meter := cpuMeter{stackPid: child.cmd.Process.Pid, postmasterPid: pmPid}

	log.Info("bench: baseline A (saga-step transactions, 16 connections)")
	tps, err := sagaStepTPS(ctx, benchURL, 16, dur(cfg.BaselineASeconds))
	if err != nil {
		return err
	}
	rep.SagaStepTPS = round(tps, 0)
	log.Info("bench: baseline B (JetStream async publishes, 512 B)")
	pps, err := jsPublishPerS(ctx, info.NATSURL, info.NATSCreds, 512, dur(cfg.BaselineBSeconds))
	if err != nil {
		return err
	}
	rep.JSPublishPerS = round(pps, 0)

	// Idle: what the system costs with no trips (polling), after a second
	// for the baselines' aftermath. /proc counts CPU in 10 ms ticks, so
	// idle figures have a resolution of 2 ms/s.
	time.Sleep(time.Second)
	idle := 5 * time.Second
	c0 := meter.sample()
	p0, err := pm.sample(ctx)
	if err != nil {
		return err
	}
	time.Sleep(idle)
	c1 := meter.sample()
	p1, err := pm.sample(ctx)
	if err != nil {
		return err
	}
	idleCPU := map[string]float64{}
	for k, v := range c1.ms {
		idleCPU[k] = (v - c0.ms[k]) / c1.at.Sub(c0.at).Seconds()
	}
	rep.PGIdleTransactionsPerS = round(float64(p1.xacts-p0.xacts-(p1.own-p0.own))/c1.at.Sub(c0.at).Seconds(), 1)

	l := newLoader("http://"+info.Addr["trips"], cfg.Progress)
	m := &fullMeters{natsURL: info.NATSURL, natsCreds: info.NATSCreds, cpu: meter, pg: pm, idleCPU: idleCPU, natsDir: filepath.Join(cfg.Dir, "scratch-nats"), benchURL: benchURL}
	if err := loadPhases(ctx, cfg, rep, l, m); err != nil {
		return err
	}
	if len(cfg.Replicas) > 0 {
		// Each point of the curve is a system of its own, started afresh
		// on the same cluster: ours stops first.
		child.stop()
		if err := runScaling(ctx, cfg, rep, pg.URL, pmPid); err != nil {
			return err
		}
	}
	if cfg.Peer != "" {
		// The peer runs right after our trips (the machine's load alike)
		// and alone: our system stops first.
		child.stop()
		if err := runPeer(ctx, cfg, rep, peerEnv{adminURL: pg.URL, pmPid: pmPid, mon: mconn, bin: peerBin, library: peerLib}); err != nil {
			return err
		}
	}
	return scratchPhases(ctx, cfg, rep, m)
}

// fullMeters are the meters of a system the bench started.
type fullMeters struct {
	// natsURL and natsCreds reach the system's NATS (the events' store
	// times, for Report.Hops).
	natsURL, natsCreds string
	cpu                cpuMeter
	pg                 *pgMeter
	idleCPU            map[string]float64
	natsDir            string
	benchURL           string
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func dur(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// withDB returns base (a postgres:// URL) on database db, as user with
// password when user is set.
func withDB(base, db, user, password string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	u.Path = "/" + db
	if user != "" {
		u.User = url.UserPassword(user, password)
	}
	return u.String(), nil
}

// loadPhases runs the closed loops, then the open loops, and, with meters,
// the per-trip costs.
func loadPhases(ctx context.Context, cfg Config, rep *Report, l *loader, m *fullMeters) (err error) {
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(error)
			if !ok {
				panic(r)
			}
			err = e
		}
	}()
	var t0 time.Time
	var best *LoadRun
	// Warm up (connections, caches, JetStream consumers) with a few trips
	// that are not measured, but must settle too.
	if n := min(100, cfg.Trips/10); n >= 5 {
		cfg.Logger.Info("bench: warm-up", "trips", n)
		warm := l.closedLoop(ctx, n, cfg.Concurrency[0])
		settle(ctx, l, warm, m)
		rep.WarmupTrips = n
		if !warm.Settled {
			rep.Settled = false
			rep.Notes = append(rep.Notes, "warm-up not settled: "+warm.SettledNote)
		}
	}
	for _, clients := range cfg.Concurrency {
		cfg.Logger.Info("bench: closed loop", "clients", clients, "trips", cfg.Trips)
		var c0 cpuSample
		var p0 pgSample
		if m != nil {
			must(0, m.pg.reset(ctx))
			c0, p0 = m.cpu.sample(), must(m.pg.sample(ctx))
		}
		run := l.closedLoop(ctx, cfg.Trips, clients)
		if t0.IsZero() {
			t0 = run.start
		}
		settle(ctx, l, run, m)
		rep.addSamples(run, t0, fmt.Sprintf("closed %d clients", clients))
		if m != nil {
			// Let idle backends flush their counters (PostgreSQL does so at
			// most once a second).
			time.Sleep(2 * time.Second)
			c1, p1 := m.cpu.sample(), must(m.pg.sample(ctx))
			better := best == nil || run.AchievedPerS > best.AchievedPerS
			if (run.Settled && better) || (best == nil && rep.CPU == nil) {
				rep.perTrip(ctx, run, m, c0, c1, p0, p1)
			}
			if rep.Hops == nil && run.Settled {
				m.pg.own++
				switch rep.Hops, err = measureHops(ctx, m.pg.conn, m.natsURL, m.natsCreds, clients, run.tripIDs); {
				case err != nil:
					rep.Notes = append(rep.Notes, err.Error())
					rep.Hops, err = nil, nil
				case rep.Hops.Trips == 0:
					rep.Notes = append(rep.Notes, fmt.Sprintf("bench: hops: no trip of the closed loop of %d clients has every stamp of the path", clients))
					rep.Hops = nil
				}
			}
		}
		rep.ClosedLoop = append(rep.ClosedLoop, *run)
		rep.Settled = rep.Settled && run.Settled
		if run.Settled && (best == nil || run.AchievedPerS > best.AchievedPerS) {
			best = run
		}
	}
	if best == nil {
		rep.Notes = append(rep.Notes, "no closed loop settled: no maximum, no open loops")
		rep.Settled = false
	} else {
		rep.TripsPerS = best.AchievedPerS
		for _, pct := range cfg.OpenPercents {
			if cfg.OpenSeconds <= 0 {
				break
			}
			rate := best.AchievedPerS * float64(pct) / 100
			if rate <= 0 {
				continue
			}
			cfg.Logger.Info("bench: open loop", "percent", pct, "trips_per_s", rate)
			run := l.openLoop(ctx, rate, dur(cfg.OpenSeconds), pct)
			settle(ctx, l, run, m)
			rep.addSamples(run, t0, fmt.Sprintf("open %d %%", pct))
			rep.OpenLoop = append(rep.OpenLoop, *run)
			rep.Settled = rep.Settled && run.Settled
		}
	}
	return nil
}

// perTrip fills the per-trip costs from the meters around run.
func (rep *Report) perTrip(ctx context.Context, run *LoadRun, m *fullMeters, c0, c1 cpuSample, p0, p1 pgSample) {
	n := float64(max(run.Confirmed, 1))
	rep.PGTransactionsPerTrip = round(float64(p1.xacts-p0.xacts-(p1.own-p0.own))/n, 1)
	rep.PGStatementsPerTrip = round(float64(p1.stmts)/n, 1)
	rep.PGStatementsPerTripNoTxControl = round(float64(p1.stmtsNoTx)/n, 1)
	rep.TopStatements, _ = m.pg.top(ctx, int(n), 15)
	rep.CPU, rep.CPUMSPerTrip = nil, 0
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range c1.ms {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range names {
		if old, ok := c0.pids[k]; ok && c1.pids[k] != old {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s restarted during the closed loop: its CPU figure misses the old process", k))
		}
		v := round((c1.ms[k]-c0.ms[k])/n, 2)
		rep.CPU = append(rep.CPU, ProcessCPU{Process: k, MSPerTrip: v, IdleMSPerS: round(m.idleCPU[k], 1)})
		rep.CPUMSPerTrip += v
	}
	sort.SliceStable(rep.CPU, func(i, j int) bool { return rep.CPU[i].MSPerTrip > rep.CPU[j].MSPerTrip })
	rep.CPUMSPerTrip = round(rep.CPUMSPerTrip, 2)
	if lag, err := m.pg.reconcilerLag(ctx, run.tripIDs); err == nil {
		rep.ReconcilerLag = lag
	} else {
		rep.Notes = append(rep.Notes, err.Error())
	}
}

// settle checks, after a run, that every trip was confirmed and nothing is
// left pending; on a system the bench started it also waits (at most 2
// minutes) until the reconciler's view has every trip settled and mailed.
func settle(ctx context.Context, l *loader, run *LoadRun, m *fullMeters) {
	var why []string
	if run.Confirmed != run.Trips {
		why = append(why, fmt.Sprintf("%d of %d trips confirmed (answers: %s; errors: %s)", run.Confirmed, run.Trips, FormatCounts(run.Answers), FormatCounts(run.Errors)))
	}
	if m != nil && len(run.tripIDs) > 0 {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			n, err := m.pg.reconcilerSettled(ctx, run.tripIDs)
			if err != nil {
				why = append(why, err.Error())
				break
			}
			if n == run.Confirmed {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				why = append(why, fmt.Sprintf("the reconciler saw %d of %d confirmed trips settled and mailed after 2 minutes", n, run.Confirmed))
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if n, err := l.unsettled(ctx); err != nil {
		why = append(why, err.Error())
	} else if n > 0 {
		why = append(why, "the trips API still lists pending or canceling trips")
	}
	run.Settled = len(why) == 0
	run.SettledNote = strings.Join(why, "; ")
}

func (rep *Report) addSamples(run *LoadRun, t0 time.Time, name string) {
	for _, s := range run.samples {
		rep.samples = append(rep.samples, timedSample{t: s.at.Sub(t0).Seconds(), ms: float64(s.lat.Microseconds()) / 1000, run: name})
	}
}

// scratchPhases measures the relay and the rebuild on a second NATS server.
func scratchPhases(ctx context.Context, cfg Config, rep *Report, m *fullMeters) error {
	sopts := &server.Options{ServerName: "bench-scratch", Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: m.natsDir, NoSigs: true, NoLog: true}
	natssync.Apply(sopts)
	ns, err := server.NewServer(sopts)
	if err != nil {
		return fmt.Errorf("bench: scratch NATS: %w", err)
	}
	go ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(30 * time.Second) {
		return errors.New("bench: scratch NATS did not start")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return fmt.Errorf("bench: scratch NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("bench: scratch NATS: %w", err)
	}
	if err := events.EnsureStreams(ctx, js, events.Default); err != nil {
		return fmt.Errorf("bench: scratch NATS: %w", err)
	}
	cfg.Logger.Info("bench: outbox relay", "backlog", cfg.RelayEvents)
	if rep.Relay, err = relayBench(ctx, m.benchURL, js, cfg.RelayEvents); err != nil {
		return err
	}
	rep.RelayEventsPerS = rep.Relay.DrainPerS
	cfg.Logger.Info("bench: store sync and outbox verify", "backlog", cfg.RelayEvents)
	sr, err := syncBench(ctx, m.benchURL, ns, m.natsDir+"-default-sync", cfg.RelayEvents, min(3*time.Second, time.Duration(cfg.BaselineBSeconds*float64(time.Second))))
	if err != nil {
		return err
	}
	rep.Sync = &sr
	cfg.Logger.Info("bench: reconciler rebuild", "events", cfg.RebuildEvents)
	if rep.Rebuild, err = rebuildBench(ctx, m.benchURL, js, cfg.RebuildEvents); err != nil {
		return err
	}
	rep.RebuildEventsPerS = rep.Rebuild[0].EventsPerS
	if rep.Rebuild[0].DurationS > 0 {
		rep.RebuildTimeRatio = round(rep.Rebuild[1].DurationS/rep.Rebuild[0].DurationS, 2)
		rep.RebuildLinear = rep.RebuildTimeRatio <= 2.2
	}
	return nil
}

// ratios relates the figures to the same run's baselines.
func (rep *Report) ratios() {
	add := func(name string, v float64, target string) {
		if !math.IsNaN(v) && !math.IsInf(v, 0) && v != 0 {
			rep.Ratios = append(rep.Ratios, Ratio{Name: name, Value: v, Target: target})
		}
	}
	a, b := rep.SagaStepTPS, rep.JSPublishPerS
	if rep.TripsPerS > 0 && a > 0 {
		add("baseline A tx/s ÷ trips/s", round(a/rep.TripsPerS, 1), "≤ 20")
		if rep.PGTransactionsPerTrip > 0 {
			add("PostgreSQL tx/s at the max ÷ baseline A", round(rep.TripsPerS*rep.PGTransactionsPerTrip/a, 2), "")
		}
	}
	if rep.TripsPerS > 0 && b > 0 {
		add("baseline B publishes/s ÷ trips/s", round(b/rep.TripsPerS, 0), "")
	}
	if rep.PGTransactionsPerTrip > 0 {
		add("PostgreSQL transactions per trip", rep.PGTransactionsPerTrip, "≤ 12")
		add("PostgreSQL statements per trip", rep.PGStatementsPerTrip, "≤ 60")
	}
	for _, o := range rep.OpenLoop {
		if o.OfferedPerS > 0 {
			add(fmt.Sprintf("open loop %d %%: achieved ÷ offered", o.OfferedPercent), round(o.AchievedPerS/o.OfferedPerS, 2), "1.0")
		}
		if o.OfferedPercent == 50 {
			add("open loop 50 %: p99 answer ms", o.Answer.P99, "≤ 100")
		}
	}
	if sr := rep.Sync; sr != nil {
		if sr.PublishDefaultPerS > 0 {
			add("publishes/s, sync always ÷ default sync", round(sr.PublishAlwaysPerS/sr.PublishDefaultPerS, 2), "")
		}
		if sr.RelayDefaultPerS > 0 {
			add("relay drain, sync always ÷ default sync", round(sr.RelayAlwaysPerS/sr.RelayDefaultPerS, 2), "")
		}
		if sr.RelayAlwaysPerS > 0 {
			add("relay drain, verify passes back to back ÷ none", round(sr.RelayVerifyingPerS/sr.RelayAlwaysPerS, 2), "")
		}
	}
	if rep.RelayEventsPerS > 0 {
		if b > 0 {
			add("relay drain events/s ÷ baseline B", round(rep.RelayEventsPerS/b, 2), "")
		}
		if a > 0 {
			add("relay drain events/s ÷ baseline A", round(rep.RelayEventsPerS/a, 2), "")
		}
		add("relay drain events/s", rep.RelayEventsPerS, "≥ 30,000")
	}
	if rep.RebuildEventsPerS > 0 {
		if a > 0 {
			add("rebuild events/s ÷ baseline A", round(rep.RebuildEventsPerS/a, 2), "")
		}
		add("rebuild events/s", rep.RebuildEventsPerS, "≥ 50,000")
		add("rebuild time 2n ÷ n", rep.RebuildTimeRatio, "≤ 2.2")
	}
	if rep.ReconcilerLag.P99 > 0 {
		add("reconciler lag p99 ms at the max", rep.ReconcilerLag.P99, "< 1,000")
	}
	// Issue 23's targets against the peer, each ours ÷ the peer's.
	for _, r := range rep.sideBySide() {
		target := ""
		switch {
		case r.Figure == "trips/s, 32 clients":
			target = "≥ 1"
		case r.Figure == "answer p50 ms, 1 clients":
			target = "≤ 2"
		case strings.HasPrefix(r.Figure, "answer p99") || strings.HasPrefix(r.Figure, "PostgreSQL statements"):
			continue
		}
		add(r.Figure+": ours ÷ "+rep.Peer.Name+"'s", r.Ratio, target)
	}
}

// stackChild is the stack process (`tripsaga bench stack`).
type stackChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
}

func (c *stackChild) stop() {
	_ = c.stdin.Close()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// startStack runs `<binary> bench stack --dir <Dir>/stack` with the cluster's
// URL and waits for the line it prints when every process is ready.
func startStack(ctx context.Context, cfg Config, databaseURL string, shape stackShape) (*stackChild, stackInfo, error) {
	bin := cfg.Binary
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, stackInfo{}, fmt.Errorf("bench: %w", err)
		}
		bin = exe
	}
	dir := filepath.Join(cfg.Dir, "stack"+shape.suffix())
	logPath := filepath.Join(cfg.Dir, "stack"+shape.suffix()+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, stackInfo{}, fmt.Errorf("bench: %w", err)
	}
	cmd := exec.Command(bin, "bench", "stack", "--dir", dir)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL)
	if shape.Replicas > 0 {
		cmd.Env = append(cmd.Env, replicasEnv+"="+strconv.Itoa(shape.Replicas), natsNodesEnv+"="+strconv.Itoa(shape.NATSNodes))
	}
	if cfg.SimMemory {
		cmd.Env = append(cmd.Env, "SIM_MEMORY=1")
	} else {
		cmd.Env = append(cmd.Env, "SIM_MEMORY=0")
	}
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, stackInfo{}, fmt.Errorf("bench: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, stackInfo{}, fmt.Errorf("bench: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, stackInfo{}, fmt.Errorf("bench: start the stack: %w", err)
	}
	c := &stackChild{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	go func() { _ = cmd.Wait(); logf.Close(); close(c.done) }()
	fail := func(err error) (*stackChild, stackInfo, error) {
		c.stop()
		b, _ := os.ReadFile(logPath)
		if len(b) > 3000 {
			b = b[len(b)-3000:]
		}
		return nil, stackInfo{}, fmt.Errorf("bench: the stack did not start (log %s): %w\n%s", logPath, err, b)
	}
	select {
	case line := <-lines:
		var info stackInfo
		if err := json.Unmarshal([]byte(line), &info); err != nil || info.Addr["trips"] == "" {
			return fail(fmt.Errorf("unexpected first line %q", line))
		}
		return c, info, nil
	case <-c.done:
		return fail(errors.New("it exited"))
	case <-time.After(3 * time.Minute):
		return fail(errors.New("not ready after 3 minutes"))
	case <-ctx.Done():
		return fail(ctx.Err())
	}
}

// ServeStack runs the whole system (as `up` does, on DATABASE_URL) in dir,
// prints one JSON line {"nats_url":..., "addr":{process: host:port}} to out
// when every process is ready, and stops it when ctx ends or in reaches
// EOF. It is the stack process of `tripsaga bench` (`tripsaga bench stack`),
// so that the embedded NATS server's CPU is measured apart from the bench's.
func ServeStack(ctx context.Context, dir string, in io.Reader, out io.Writer, log *slog.Logger) error {
	replicas, _ := strconv.Atoi(os.Getenv(replicasEnv))
	nodes, _ := strconv.Atoi(os.Getenv(natsNodesEnv))
	s, err := stack.Start(ctx, stack.Config{Dir: dir, Durable: true, DatabaseURL: os.Getenv("DATABASE_URL"), Logger: log,
		Replicas: replicas, NATSCluster: nodes})
	if err != nil {
		return err
	}
	defer s.Stop()
	b, err := json.Marshal(stackInfo{NATSURL: s.NATSURL, NATSCreds: s.Creds(natsauth.Admin), Addr: s.Addr, Trips: s.URLs("trips")})
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(out, "%s\n", b); err != nil {
		return err
	}
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, in); close(eof) }()
	select {
	case <-ctx.Done():
	case <-eof:
	}
	return nil
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func numCPU() int { return runtime.NumCPU() }
