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
// of trips, a few hundred events) so the command cannot rot. It asserts
// that every figure is produced, every trip settled and the charts written;
// never a speed.
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
	for _, want := range []string{"fsync=on", "synchronous_commit=on", "records: memory", "baseline A tx/s ÷ trips/s", "every trip confirmed"} {
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
