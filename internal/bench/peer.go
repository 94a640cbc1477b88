package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/sim"
)

// Peers are the values --peer takes: the same trip saga written with
// another library, measured in the same run (bench/peers/<name>).
var Peers = []string{"dbos"} //nolint:gochecknoglobals // read-only

// peerDB is the peer's own database on the bench's cluster.
const peerDB = "dbos_peer"

// Process names in the peer's CPU table.
const (
	procPeer    = "dbos-peer"
	procPeerSim = "sim (its own process)"
)

// PeerReport is the peer's figures, measured as ours are: the same closed
// loops (clients, trips, POST /trips with Prefer: wait=60) on the same
// cluster, with company simulators of the same code in their own process.
type PeerReport struct {
	Name string `json:"name"`
	// Library is the peer's library and version, from its go.mod.
	Library     string    `json:"library"`
	WarmupTrips int       `json:"warmup_trips"`
	TripsPerS   float64   `json:"trips_per_s"`
	ClosedLoop  []LoadRun `json:"closed_loop"`
	// The per-trip figures are those of the peer's best closed loop, with
	// the same 2 s after it as ours.
	PGTransactionsPerTrip          float64      `json:"pg_transactions_per_trip"`
	PGStatementsPerTrip            float64      `json:"pg_statements_per_trip"`
	PGStatementsPerTripNoTxControl float64      `json:"pg_statements_per_trip_without_begin_commit"`
	TopStatements                  []Statement  `json:"top_statements,omitempty"`
	CPU                            []ProcessCPU `json:"cpu"`
	CPUMSPerTrip                   float64      `json:"cpu_ms_per_trip_total"`
	// Rejections are the trips booked after the loops to be rejected: a
	// declined card and a sold-out car.
	Rejections []RejectionRun `json:"rejections"`
	Audit      PeerAudit      `json:"audit"`
	Settled    bool           `json:"settled"`
	Notes      []string       `json:"notes,omitempty"`
}

// RejectionRun is a few trips sent one at a time that a company rejects.
type RejectionRun struct {
	// Kind is "card declined" or "car sold out".
	Kind string `json:"kind"`
	// Trips sent and how many ended canceled with the rejection's reason.
	Trips    int     `json:"trips"`
	Canceled int     `json:"canceled"`
	Answers  []Count `json:"answers"`
}

// PeerAudit is every peer trip checked against the companies' own records
// (their list endpoints, docs/contracts/providers.md): a confirmed trip
// whole (hold held, card charged, car booked, one mail), a canceled one
// empty (nothing held, charged or booked: released, refunded or declined,
// canceled, or never made; one mail); nothing doubled (at most one record
// per trip and company) and no record of an unknown trip.
type PeerAudit struct {
	Trips int `json:"trips"`
	Whole int `json:"whole"`
	Empty int `json:"empty"`
	// Bad counts trips neither whole nor empty, doubled, or unknown to the
	// peer; Problems names the first few.
	Bad      int      `json:"bad"`
	Problems []string `json:"problems,omitempty"`
}

// ok is true when every trip audited whole or empty.
func (a PeerAudit) ok() bool { return a.Bad == 0 && a.Whole+a.Empty == a.Trips }

// peerDir finds the peer's module folder: cfg.PeerDir, or
// bench/peers/<name> in the working folder or one of its parents.
func peerDir(cfg Config) (string, error) {
	if cfg.PeerDir != "" {
		if _, err := os.Stat(filepath.Join(cfg.PeerDir, "go.mod")); err != nil {
			return "", fmt.Errorf("%w: --peer-dir %s: no go.mod there: %v", ErrBadFlag, cfg.PeerDir, err)
		}
		return filepath.Abs(cfg.PeerDir)
	}
	d, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("bench: --peer: %w", err)
	}
	for {
		p := filepath.Join(d, "bench", "peers", cfg.Peer)
		if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
			return p, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", fmt.Errorf("%w: --peer %s: bench/peers/%s/go.mod not found in the working folder or above it; run from the repository or give --peer-dir", ErrBadFlag, cfg.Peer, cfg.Peer)
		}
		d = up
	}
}

// buildPeer builds the peer's module into dir and returns the binary and
// its library's version.
func buildPeer(ctx context.Context, cfg Config, dir string) (bin, library string, err error) {
	mod, err := peerDir(cfg)
	if err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("bench: %w", err)
	}
	bin = filepath.Join(dir, "peer-"+cfg.Peer)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = mod
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("bench: --peer %s: go build in %s: %w\n%s", cfg.Peer, mod, err, bytes.TrimSpace(out))
	}
	library = "github.com/dbos-inc/dbos-transact-golang"
	if b, err := os.ReadFile(filepath.Join(mod, "go.mod")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && (f[0] == library || (f[0] == "require" && len(f) >= 3 && f[1] == library)) {
				library += " " + f[len(f)-1]
				break
			}
		}
	}
	return bin, library, nil
}

// child is a process the peer phase started.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// tail is the end of the child's log, for errors.
func (c *child) tail() string {
	b, _ := os.ReadFile(c.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// startChild runs bin with args and env added, its stderr (and stdout,
// unless stdout is wanted) into logPath.
func startChild(name, bin string, args, env []string, logPath string, stdout bool) (*child, io.Reader, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logf
	var out io.Reader
	if stdout {
		if out, err = cmd.StdoutPipe(); err != nil {
			logf.Close()
			return nil, nil, fmt.Errorf("bench: %w", err)
		}
	} else {
		cmd.Stdout = logf
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, nil, fmt.Errorf("bench: start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); logf.Close(); close(c.done) }()
	return c, out, nil
}

// freeAddr returns a 127.0.0.1 address with a port free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// waitHealthy waits (at most 2 minutes) until GET base/healthz answers 200.
func waitHealthy(ctx context.Context, c *child, base string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/healthz", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-c.done:
			return fmt.Errorf("bench: %s exited (log %s):\n%s", c.name, c.log, c.tail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %s not healthy after 2 minutes (log %s):\n%s", c.name, c.log, c.tail())
		}
	}
}

// peerCPU samples the CPU of the peer, its simulators, PostgreSQL and the
// bench itself.
func peerCPU(pmPid, peerPid, simPid int) cpuSample {
	s := cpuSample{at: time.Now(), ms: map[string]float64{}, pids: map[string]int{procPeer: peerPid, procPeerSim: simPid}}
	for _, st := range allStats() {
		switch {
		case st.pid == os.Getpid():
			s.ms[procBench] = st.cpu
		case st.pid == peerPid:
			s.ms[procPeer] = st.cpu
		case st.pid == simPid:
			s.ms[procPeerSim] = st.cpu
		case st.pid == pmPid:
			s.ms[procPostgres] += st.cpu + st.children
		case st.ppid == pmPid:
			s.ms[procPostgres] += st.cpu
		}
	}
	return s
}

// peerEnv is what runPeer needs of the full run.
type peerEnv struct {
	adminURL string // superuser URL of the cluster
	pmPid    int
	mon      *pgx.Conn // the monitoring role's connection (database postgres)
	bin      string    // the peer's binary, from buildPeer
	library  string
}

// runPeer measures the peer: it builds it, starts company simulators of
// the same code in their own process (records in memory, as ours when
// --sim-memory) and the peer on its own database of the same cluster, runs
// the same warm-up and closed loops, books trips that a company rejects,
// and audits every trip against the simulators' records.
func runPeer(ctx context.Context, cfg Config, rep *Report, pe peerEnv) error {
	log := cfg.Logger
	pr := &PeerReport{Name: cfg.Peer, Settled: true}
	rep.Peer = pr
	defer func() { rep.Settled = rep.Settled && pr.Settled }()
	dir := filepath.Join(cfg.Dir, "peer-"+cfg.Peer)
	bin := pe.bin
	pr.Library = pe.library

	admin, err := pgx.Connect(ctx, pe.adminURL)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	var has bool
	_ = admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", peerDB).Scan(&has)
	if !has {
		_, err = admin.Exec(ctx, "CREATE DATABASE "+peerDB)
	}
	admin.Close(ctx)
	if err != nil {
		return fmt.Errorf("bench: create database %s: %w", peerDB, err)
	}
	dbURL, err := withDB(pe.adminURL, peerDB, "", "")
	if err != nil {
		return err
	}

	exe := cfg.Binary
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	simAddr, err := freeAddr()
	if err != nil {
		return err
	}
	simArgs := []string{"serve", "sim"}
	simEnv := []string{"HTTP_ADDR=" + simAddr, "SIM_MEMORY=0"}
	if cfg.SimMemory {
		simArgs = append(simArgs, "--memory")
	} else {
		simEnv = append(simEnv, "DATABASE_URL="+dbURL)
	}
	simc, _, err := startChild("the peer's simulators", exe, simArgs, simEnv, filepath.Join(dir, "sim.log"), false)
	if err != nil {
		return err
	}
	defer simc.stop()
	simURL := "http://" + simAddr
	if err := waitHealthy(ctx, simc, simURL); err != nil {
		return err
	}

	peerAddr, err := freeAddr()
	if err != nil {
		return err
	}
	pc, _, err := startChild(procPeer, bin, nil, []string{
		"DATABASE_URL=" + dbURL, "HTTP_ADDR=" + peerAddr,
		"HOTEL_URL=" + simURL + "/hotel", "PAYMENTS_URL=" + simURL + "/payments", "CARS_URL=" + simURL + "/cars", "MAIL_URL=" + simURL + "/mail",
	}, filepath.Join(dir, "peer.log"), false)
	if err != nil {
		return err
	}
	defer pc.stop()
	peerURL := "http://" + peerAddr
	if err := waitHealthy(ctx, pc, peerURL); err != nil {
		return err
	}

	pm := &pgMeter{conn: pe.mon, db: peerDB}
	l := newLoader(peerURL, cfg.Progress)
	var all []string
	status := map[string]string{} // trip → final status known to the bench
	if n := min(100, cfg.Trips/10); n >= 5 {
		log.Info("bench: peer warm-up", "trips", n)
		warm := l.closedLoop(ctx, n, cfg.Concurrency[0])
		settle(ctx, l, warm, nil)
		pr.WarmupTrips = n
		all = append(all, warm.tripIDs...)
		if !warm.Settled {
			pr.Settled = false
			pr.Notes = append(pr.Notes, "warm-up not settled: "+warm.SettledNote)
		}
	}
	var best *LoadRun
	for _, clients := range cfg.Concurrency {
		log.Info("bench: peer closed loop", "clients", clients, "trips", cfg.Trips)
		if err := pm.reset(ctx); err != nil {
			return err
		}
		c0 := peerCPU(pe.pmPid, pc.cmd.Process.Pid, simc.cmd.Process.Pid)
		p0, err := pm.sample(ctx)
		if err != nil {
			return err
		}
		run := l.closedLoop(ctx, cfg.Trips, clients)
		settle(ctx, l, run, nil)
		time.Sleep(2 * time.Second) // as ours: idle backends flush their counters
		c1 := peerCPU(pe.pmPid, pc.cmd.Process.Pid, simc.cmd.Process.Pid)
		p1, err := pm.sample(ctx)
		if err != nil {
			return err
		}
		if run.Settled && (best == nil || run.AchievedPerS > best.AchievedPerS) || (best == nil && pr.CPU == nil) {
			pr.perTrip(ctx, run, pm, c0, c1, p0, p1)
		}
		all = append(all, run.tripIDs...)
		pr.ClosedLoop = append(pr.ClosedLoop, *run)
		pr.Settled = pr.Settled && run.Settled
		if run.Settled && (best == nil || run.AchievedPerS > best.AchievedPerS) {
			best = run
		}
	}
	if best != nil {
		pr.TripsPerS = best.AchievedPerS
	}
	for _, id := range all {
		status[id] = "confirmed" // settle checked every trip of the runs was
	}

	log.Info("bench: peer rejections (declined card, sold-out car)")
	rejected, err := peerRejections(ctx, l, simURL, pr, status)
	if err != nil {
		return err
	}
	all = append(all, rejected...)
	log.Info("bench: peer audit", "trips", len(all))
	pr.Audit, err = auditTrips(ctx, simURL, all, status)
	if err != nil {
		return err
	}
	if !pr.Audit.ok() {
		pr.Settled = false
	}
	for _, r := range pr.Rejections {
		if r.Canceled != r.Trips {
			pr.Settled = false
		}
	}
	if n, err := l.unsettled(ctx); err != nil || n > 0 {
		pr.Settled = false
		pr.Notes = append(pr.Notes, fmt.Sprintf("after the rejections the peer lists %d pending workflows (%v)", n, err))
	}
	return nil
}

// perTrip fills the peer's per-trip costs from the meters around run.
func (pr *PeerReport) perTrip(ctx context.Context, run *LoadRun, pm *pgMeter, c0, c1 cpuSample, p0, p1 pgSample) {
	n := float64(max(run.Confirmed, 1))
	// The monitoring connection is on another database: nothing to subtract.
	pr.PGTransactionsPerTrip = round(float64(p1.xacts-p0.xacts)/n, 1)
	pr.PGStatementsPerTrip = round(float64(p1.stmts)/n, 1)
	pr.PGStatementsPerTripNoTxControl = round(float64(p1.stmtsNoTx)/n, 1)
	pr.TopStatements, _ = pm.top(ctx, int(n), 10)
	pr.CPU, pr.CPUMSPerTrip = nil, 0
	for _, k := range slices.Sorted(mapKeys(c1.ms)) {
		v := round((c1.ms[k]-c0.ms[k])/n, 2)
		pr.CPU = append(pr.CPU, ProcessCPU{Process: k, MSPerTrip: v})
		pr.CPUMSPerTrip += v
	}
	sort.SliceStable(pr.CPU, func(i, j int) bool { return pr.CPU[i].MSPerTrip > pr.CPU[j].MSPerTrip })
	pr.CPUMSPerTrip = round(pr.CPUMSPerTrip, 2)
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// postgresMS splits a CPU table into PostgreSQL's ms per trip and the rest.
func postgresMS(cpu []ProcessCPU) (pg, outside float64) {
	for _, c := range cpu {
		if c.Process == procPostgres {
			pg += c.MSPerTrip
		} else {
			outside += c.MSPerTrip
		}
	}
	return round(pg, 2), round(outside, 2)
}

// rejectionsPerKind is how many trips of each rejection the peer books.
const rejectionsPerKind = 5

// peerRejections books, one at a time, trips with a declined card
// (sim.DeclinedCardToken) and trips whose car is sold out (a fault rule
// of the car firm for exactly that many bookings); each must end canceled
// with its reason. It returns the trips' ids and records their status.
func peerRejections(ctx context.Context, l *loader, simURL string, pr *PeerReport, status map[string]string) ([]string, error) {
	var ids []string
	for _, kind := range []struct{ name, reason string }{{"card declined", "declined"}, {"car sold out", "sold_out"}} {
		if kind.reason == "sold_out" {
			if err := sim.AddFault(ctx, simURL+"/cars", sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut, Times: rejectionsPerKind}); err != nil {
				return nil, fmt.Errorf("bench: peer rejections: %w", err)
			}
		}
		rr := RejectionRun{Kind: kind.name, Trips: rejectionsPerKind}
		answers := map[string]int{}
		for range rejectionsPerKind {
			i := l.seq.Add(1)
			var req events.TripRequest
			_ = json.Unmarshal(tripBody(i), &req)
			if kind.reason == "declined" {
				req.Payment.CardToken = sim.DeclinedCardToken
			}
			body, _ := json.Marshal(req)
			r := l.bookBody(ctx, i, body)
			var reason string
			if r.errReason != "" {
				answers["error: "+r.errReason]++
				continue
			}
			reason = r.reason
			if r.status == "pending" {
				r.status = l.finalStatus(ctx, r.tripID)
			}
			answers[r.status]++
			ids = append(ids, r.tripID)
			status[r.tripID] = r.status
			if r.status == "canceled" && (reason == "" || reason == kind.reason) {
				rr.Canceled++
			}
		}
		rr.Answers = counts(answers)
		pr.Rejections = append(pr.Rejections, rr)
	}
	return ids, nil
}

// auditTrips reads every record of the four companies (their list
// endpoints, 1,000 a page) and checks each trip of ids against the status
// it ended with: confirmed trips whole, canceled ones empty, one mail
// each, nothing doubled, no record of a trip not in ids.
func auditTrips(ctx context.Context, simURL string, ids []string, status map[string]string) (PeerAudit, error) {
	a := PeerAudit{Trips: len(ids)}
	type rec struct{ key, status string }
	recs := map[string]map[string][]rec{} // company → trip → records
	for _, c := range []string{"hotel/holds", "payments/charges", "cars/bookings", "mail/messages"} {
		recs[c] = map[string][]rec{}
		after := ""
		for {
			u := simURL + "/" + c + "?limit=1000"
			if after != "" {
				u += "&after=" + url.QueryEscape(after)
			}
			var page struct {
				Items []struct {
					Key    string `json:"key"`
					TripID string `json:"trip_id"`
					Status string `json:"status"`
				} `json:"items"`
				Next string `json:"next"`
			}
			if err := getJSON(ctx, u, &page); err != nil {
				return a, fmt.Errorf("bench: audit: %w", err)
			}
			for _, it := range page.Items {
				recs[c][it.TripID] = append(recs[c][it.TripID], rec{it.Key, it.Status})
			}
			if page.Next == "" {
				break
			}
			after = page.Next
		}
	}
	known := map[string]bool{}
	bad := func(format string, args ...any) {
		a.Bad++
		if len(a.Problems) < 5 {
			a.Problems = append(a.Problems, fmt.Sprintf(format, args...))
		}
	}
	for _, id := range ids {
		known[id] = true
		st := status[id]
		one := func(c string) string {
			switch rs := recs[c][id]; len(rs) {
			case 0:
				return "none"
			case 1:
				return rs[0].status
			default:
				return "doubled"
			}
		}
		hold, charge, car, mails := one("hotel/holds"), one("payments/charges"), one("cars/bookings"), recs["mail/messages"][id]
		mailOK := len(mails) == 1 && mails[0].key == id+":mail:"+st
		switch {
		case st == "confirmed" && hold == "held" && charge == "charged" && car == "booked" && mailOK:
			a.Whole++
		case st == "canceled" && (hold == "none" || hold == "released") && slices.Contains([]string{"none", "refunded", "declined"}, charge) &&
			(car == "none" || car == "canceled") && mailOK:
			a.Empty++
		default:
			bad("trip %s (%s): hold %s, charge %s, car %s, %d mails", id, st, hold, charge, car, len(mails))
		}
	}
	stray := map[string][]string{} // trip → companies with a record of it
	for _, c := range slices.Sorted(mapKeys(recs)) {
		for id := range recs[c] {
			if !known[id] {
				stray[id] = append(stray[id], c)
			}
		}
	}
	for _, id := range slices.Sorted(mapKeys(stray)) {
		bad("%s hold a record of trip %s, which the peer never answered", strings.Join(stray[id], ", "), id)
	}
	return a, nil
}

func getJSON(ctx context.Context, u string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 500))
		return fmt.Errorf("GET %s: HTTP %d: %s", u, resp.StatusCode, bytes.TrimSpace(b))
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// PeerRow is one figure of ours beside the peer's, and ours ÷ the peer's.
type PeerRow struct {
	Figure string  `json:"figure"`
	Ours   float64 `json:"ours"`
	Peer   float64 `json:"peer"`
	Ratio  float64 `json:"ours_over_peer"`
}

// sideBySide lists our figures beside the peer's: each closed loop's
// trips/s and answer p50/p99 (by client count), the best trips/s, baseline
// A over it, CPU ms per trip (PostgreSQL and outside it) and PostgreSQL
// transactions and statements per trip.
func (rep *Report) sideBySide() []PeerRow {
	pr := rep.Peer
	if pr == nil {
		return nil
	}
	var rows []PeerRow
	add := func(fig string, ours, peer float64) {
		r := PeerRow{Figure: fig, Ours: ours, Peer: peer}
		if ours > 0 && peer > 0 {
			r.Ratio = round(ours/peer, 2)
		}
		rows = append(rows, r)
	}
	for _, o := range rep.ClosedLoop {
		for _, p := range pr.ClosedLoop {
			if p.Clients == o.Clients {
				add(fmt.Sprintf("trips/s, %d clients", o.Clients), o.AchievedPerS, p.AchievedPerS)
				add(fmt.Sprintf("answer p50 ms, %d clients", o.Clients), o.Answer.P50, p.Answer.P50)
				add(fmt.Sprintf("answer p99 ms, %d clients", o.Clients), o.Answer.P99, p.Answer.P99)
			}
		}
	}
	add("trips/s, best closed loop", rep.TripsPerS, pr.TripsPerS)
	if rep.SagaStepTPS > 0 && rep.TripsPerS > 0 && pr.TripsPerS > 0 {
		add("baseline A ÷ trips/s (best)", round(rep.SagaStepTPS/rep.TripsPerS, 1), round(rep.SagaStepTPS/pr.TripsPerS, 1))
	}
	add("CPU ms per trip, total", rep.CPUMSPerTrip, pr.CPUMSPerTrip)
	opg, oout := postgresMS(rep.CPU)
	ppg, pout := postgresMS(pr.CPU)
	add("CPU ms per trip, PostgreSQL", opg, ppg)
	add("CPU ms per trip, outside PostgreSQL", oout, pout)
	add("PostgreSQL transactions per trip", rep.PGTransactionsPerTrip, pr.PGTransactionsPerTrip)
	// Without BEGIN/COMMIT: ours are pipelined with other statements,
	// which pg_stat_statements does not count, the peer's are not.
	add("PostgreSQL statements per trip, without BEGIN/COMMIT", rep.PGStatementsPerTripNoTxControl, pr.PGStatementsPerTripNoTxControl)
	return rows
}
