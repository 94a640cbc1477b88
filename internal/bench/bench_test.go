package bench

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tripsaga/tripsaga/internal/pgcluster"
)

// TestShortBench runs the whole bench at a tiny size (a few seconds, tens
// of trips, a few hundred events) so the command cannot rot, with the DBOS
// peer (--peer dbos: built from bench/peers/dbos, run as a process). It
// asserts that every figure is produced for both systems, every trip
// settled, every peer trip (a declined card and a sold-out car included)
// audited whole or empty against the companies' records, and the charts
// written; never a speed.
func TestShortBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and the whole system")
	}
	if _, err := pgcluster.FindBinaries(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "tripsaga")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/tripsaga")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	rep, err := Run(context.Background(), Config{
		Dir: filepath.Join(dir, "run"), Binary: bin, SimMemory: true,
		Trips: 30, Concurrency: []int{2, 4}, OpenPercents: []int{50}, OpenSeconds: 1,
		BaselineASeconds: 0.5, BaselineBSeconds: 0.5, RelayEvents: 300, RebuildEvents: 250,
		Peer: "dbos", PeerDir: "../../bench/peers/dbos",
		Replicas: []int{2}, NATSNodes: []int{3},
	})
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	if !rep.Settled {
		t.Fatalf("not settled: %+v %+v", rep.ClosedLoop, rep.OpenLoop)
	}
	for _, r := range append(append([]LoadRun{}, rep.ClosedLoop...), rep.OpenLoop...) {
		if !r.Settled || r.Confirmed != r.Trips || len(r.Errors) != 0 {
			t.Errorf("%s run: settled %v, %d of %d confirmed, errors %v: %s", r.Mode, r.Settled, r.Confirmed, r.Trips, r.Errors, r.SettledNote)
		}
		if r.AchievedPerS <= 0 || r.Answer.P50 <= 0 || r.Answer.P99 <= 0 {
			t.Errorf("%s run lacks figures: %+v", r.Mode, r)
		}
	}
	// The scaling curve's one point: two replicas of every service on a
	// three-node JetStream cluster, booked through both trips replicas.
	if len(rep.Scaling) != 1 {
		t.Fatalf("scaling points: %+v", rep.Scaling)
	}
	if sp := rep.Scaling[0]; sp.Replicas != 2 || sp.NATSNodes != 3 || !sp.Settled || sp.TripsPerS <= 0 ||
		sp.AnswerP50MS <= 0 || sp.AnswerP99MS <= 0 || sp.OpenP99MS <= 0 || sp.CPUMSPerTrip <= 0 {
		t.Errorf("scaling point lacks figures or did not settle: %+v", sp)
	}
	if len(rep.ClosedLoop) != 2 || len(rep.OpenLoop) != 1 {
		t.Errorf("runs: %d closed, %d open", len(rep.ClosedLoop), len(rep.OpenLoop))
	}
	if sr := rep.Sync; sr == nil || sr.PublishAlwaysPerS <= 0 || sr.PublishDefaultPerS <= 0 || sr.RelayAlwaysPerS <= 0 ||
		sr.RelayDefaultPerS <= 0 || sr.RelayVerifyingPerS <= 0 || sr.VerifyReadBackPerS <= 0 {
		t.Errorf("the sync and verify figures: %+v", rep.Sync)
	}
	if rep.SimStore != "memory" {
		t.Errorf("sim store %q", rep.SimStore)
	}
	settings := map[string]string{}
	for _, s := range rep.Postgres {
		settings[s.Name] = s.Value
	}
	if settings["fsync"] != "on" || settings["synchronous_commit"] != "on" {
		t.Errorf("the bench's cluster is not durable: %v", rep.Postgres)
	}
	procs := map[string]bool{}
	for _, c := range rep.CPU {
		procs[c.Process] = c.MSPerTrip > 0
	}
	for _, p := range []string{"trips", "hotel", "payment", "car", "reconciler", "sim", procNATS, procPostgres} {
		if !procs[p] {
			t.Errorf("no CPU figure for %s: %+v", p, rep.CPU)
		}
	}
	if len(rep.Rebuild) != 2 || rep.Rebuild[0].Events != 250 || rep.Rebuild[1].Events != 500 {
		t.Errorf("rebuilds: %+v", rep.Rebuild)
	}
	if rep.ReconcilerLag.Max <= 0 || len(rep.TopStatements) == 0 || rep.PGStatementsPerTripNoTxControl <= 0 {
		t.Errorf("lag %+v, %d top statements, %v statements without BEGIN/COMMIT", rep.ReconcilerLag, len(rep.TopStatements), rep.PGStatementsPerTripNoTxControl)
	}

	// The hops of the first closed loop: every trip of it has each stamp,
	// each hop took time, and the hops add up to the whole path.
	if h := rep.Hops; h == nil || h.Clients != 2 || h.Trips != 30 || len(h.Hops) != len(hopPath())-1 {
		t.Errorf("hops: %+v", rep.Hops)
	} else {
		var sum float64
		for _, x := range h.Hops {
			if x.P50 <= 0 || x.P95 < x.P50 {
				t.Errorf("hop %s -> %s: %+v", x.From, x.To, x.Quantiles)
			}
			sum += x.P50
		}
		if h.Total.P50 <= 0 || sum < h.Total.P50/3 || sum > 3*h.Total.P50 {
			t.Errorf("hops' medians sum to %.2f ms, the whole path's median is %.2f ms", sum, h.Total.P50)
		}
	}

	t.Run("peer", func(t *testing.T) { checkPeer(t, rep) })

	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"trips_per_s", "saga_step_tps", "js_publish_per_s", "pg_transactions_per_trip", "pg_statements_per_trip", "relay_events_per_s", "rebuild_events_per_s"} {
		if v, ok := m[k].(float64); !ok || v <= 0 {
			t.Errorf("JSON field %s = %v, want a positive number", k, m[k])
		}
	}

	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"fsync=on", "synchronous_commit=on", "records: memory", "baseline A tx/s ÷ trips/s", "every trip confirmed",
		"PEER: dbos (github.com/dbos-inc/dbos-transact-golang v", "TRIPSAGA ÷ DBOS", "trips/s, 4 clients", "CPU ms per trip, outside PostgreSQL",
		"audit against the companies' records: 70 trips, 60 whole, 10 empty, 0 neither", "trips/s, 2 clients: ours ÷ dbos's", "ONE TRIP, HOP BY HOP (closed loop of 2 clients, 30 trips", "HOTEL: hotel.held stored"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
	if strings.Contains(text.String(), "map[") {
		t.Errorf("text prints Go map syntax:\n%s", text.String())
	}

	files, err := rep.Plot(filepath.Join(dir, "plots"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ChartLatency, ChartThroughput, ChartAnswer} {
		fi, err := os.Stat(filepath.Join(dir, "plots", name))
		if err != nil || fi.Size() == 0 {
			t.Errorf("chart %s: %v (wrote %v)", name, err, files)
		}
	}
}

// checkPeer asserts the peer's part of a short bench: the same closed
// loops as ours, all confirmed; its per-trip figures; both rejections
// canceled; every trip whole or empty in the companies' records; and a
// side-by-side row with a ratio for every figure.
func checkPeer(t *testing.T, rep *Report) {
	pr := rep.Peer
	if pr == nil {
		t.Fatal("no peer figures")
	}
	if !strings.HasPrefix(pr.Library, "github.com/dbos-inc/dbos-transact-golang v1.") || !pr.Settled {
		t.Errorf("library %q, settled %v: %v", pr.Library, pr.Settled, pr.Notes)
	}
	if len(pr.ClosedLoop) != len(rep.ClosedLoop) {
		t.Fatalf("peer ran %d closed loops, ours %d", len(pr.ClosedLoop), len(rep.ClosedLoop))
	}
	for i, r := range pr.ClosedLoop {
		if r.Clients != rep.ClosedLoop[i].Clients || r.Trips != rep.ClosedLoop[i].Trips {
			t.Errorf("peer loop %d: %d clients, %d trips; ours %d, %d", i, r.Clients, r.Trips, rep.ClosedLoop[i].Clients, rep.ClosedLoop[i].Trips)
		}
		if !r.Settled || r.Confirmed != r.Trips || len(r.Errors) != 0 || r.AchievedPerS <= 0 || r.Answer.P50 <= 0 || r.Answer.P99 <= 0 {
			t.Errorf("peer run: %+v", r)
		}
	}
	if pr.TripsPerS <= 0 || pr.PGTransactionsPerTrip <= 0 || pr.PGStatementsPerTrip <= 0 || pr.CPUMSPerTrip <= 0 {
		t.Errorf("peer per-trip figures: %+v", pr)
	}
	procs := map[string]bool{}
	for _, c := range pr.CPU {
		procs[c.Process] = c.MSPerTrip > 0
	}
	for _, p := range []string{procPeer, procPeerSim, procPostgres} {
		if !procs[p] {
			t.Errorf("no peer CPU figure for %s: %+v", p, pr.CPU)
		}
	}
	if len(pr.Rejections) != 2 {
		t.Fatalf("rejections: %+v", pr.Rejections)
	}
	for _, r := range pr.Rejections {
		if r.Trips != rejectionsPerKind || r.Canceled != r.Trips {
			t.Errorf("%s: %d of %d canceled with the reason (%v)", r.Kind, r.Canceled, r.Trips, r.Answers)
		}
	}
	// 2 loops of 30 trips confirmed, 10 rejected.
	if a := pr.Audit; a.Trips != 70 || a.Whole != 60 || a.Empty != 10 || a.Bad != 0 {
		t.Errorf("audit: %+v", a)
	}
	rows := rep.sideBySide()
	if len(rows) != 2*3+7 {
		t.Errorf("%d side-by-side rows: %+v", len(rows), rows)
	}
	for _, r := range rows {
		if r.Ours <= 0 || r.Peer <= 0 || r.Ratio <= 0 {
			t.Errorf("side by side %q: ours %v, peer %v, ratio %v", r.Figure, r.Ours, r.Peer, r.Ratio)
		}
	}
}
