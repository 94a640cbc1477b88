package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
)

func TestParseFaultsPGFailover(t *testing.T) {
	got, err := ParseFaults("pg-failover,kill", 0, 2, true)
	require.NoError(t, err)
	require.Equal(t, []string{DisruptKill, DisruptPGFailover}, got)

	_, err = ParseFaults("kill, pg-failover", 0, 2, false)
	require.ErrorContains(t, err, "pg-failover needs a PostgreSQL HA pair (--pg-ha")

	got, err = ParseFaults("all", 3, 2, true)
	require.NoError(t, err)
	require.ElementsMatch(t, append([]string{DisruptPGFailover}, Disruptions...), got, "all on a pair takes pg-failover too")
	got, err = ParseFaults("all", 3, 2, false)
	require.NoError(t, err)
	require.ElementsMatch(t, Disruptions, got, "all without a pair leaves it out")

	_, err = ParseFaults("pg-failvoer", 0, 2, true)
	require.ErrorContains(t, err, `unknown kind "pg-failvoer"`)
}

// TestChaosPGFailover runs `tripsaga chaos --pg-ha --faults
// pg-failover,kill` as a user would: the stack on a pg_auto_failover pair,
// two replicas of every service, company faults on every call, and in
// turn a service replica SIGKILLed or the PostgreSQL primary killed (the
// standby promoted, the old primary rejoining as standby before the next
// disruption). The run must exit 0 and its report say: no half trip,
// nothing doubled, one mail per trip, every trip settled, never two
// calls of one key in flight, and at least one failover made, each with
// its time until writable. Nothing is timed: the run waits as long as the
// system takes to settle (within the settle limit).
func TestChaosPGFailover(t *testing.T) {
	// A run of its own (its own folder, cluster and ports): the two chaos
	// runs wait on the system mostly, so they overlap.
	t.Parallel()
	testenv.PGAutoctl(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "tripsaga")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/tripsaga").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	// A bound on the whole run, not a figure: on a host busy with the
	// rest of the suite its start alone took 1.5 min and the run 9.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "chaos", "--pg-ha", "--duration", "90s", "--rate", "4", "--replicas", "2",
		"--kill-every", "4s", "--faults", "pg-failover,kill", "--settle-limit", "5m", "--json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	tail := stderr.Bytes()
	if len(tail) > 6000 {
		tail = tail[len(tail)-6000:]
	}
	var rep Report
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep), "the report is one JSON object; stderr:\n%s", tail)
	var text bytes.Buffer
	rep.Print(&text)
	t.Logf("report:\n%s", text.String())
	require.NoError(t, runErr, "stderr:\n%s", tail)

	require.Empty(t, rep.Problems)
	require.True(t, rep.PGHA)
	require.Positive(t, rep.Trips)
	require.Zero(t, rep.Half, "half trips")
	require.Zero(t, rep.DuplicatesTotal, "duplicates: %v", rep.Duplicates)
	require.Zero(t, rep.Unsettled, "trips not settled")
	require.Zero(t, rep.OverlappingCallsTotal, "never two calls of one key in flight: %v", rep.OverlappingCalls)
	require.True(t, rep.Settled)
	require.Equal(t, rep.Trips, rep.Whole+rep.Empty)
	require.Equal(t, MailStats{ExactlyOne: rep.Trips}, rep.Mails, "one mail per trip")
	require.Positive(t, rep.Disruptions[DisruptPGFailover], "failovers: %v (errors %v)", rep.Disruptions, rep.KillErrors)
	require.Len(t, rep.PGFailovers, rep.Disruptions[DisruptPGFailover])
	for _, f := range rep.PGFailovers {
		require.NotEqual(t, f.Killed, f.Promoted, "%+v", f)
		require.Positive(t, f.WritableMS, "%+v", f)
		require.Greater(t, f.RejoinedMS, f.WritableMS, "%+v", f)
	}
	require.Empty(t, rep.KillErrors)
}
