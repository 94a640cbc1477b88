package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestChaosTwoMinutes runs `tripsaga chaos` as a user would, for two
// minutes with two replicas of every service and a three-node JetStream
// cluster: random company faults on every call, and every few seconds a
// disruption of every kind in turn (a random instance, NATS nodes
// included, SIGKILLed; a JetStream leader stepped down; a node restarted
// with an empty store; an acked event deleted; a replica's network cut
// from PostgreSQL or NATS). The run must exit 0 and
// its report say: no half trip, nothing doubled, one mail per trip, every
// trip settled, never two calls of one key in flight at a company, and that faults and kills really happened. Nothing here
// is timed: the run waits as long as the system takes to settle (within
// the settle limit).
func TestChaosTwoMinutes(t *testing.T) {
	// A run of its own (its own folder, cluster and ports): the two chaos
	// runs wait on the system mostly, so they overlap.
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "tripsaga")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/tripsaga").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	disruptions := Disruptions // every kind: kill, step-down, empty-store, lose-acked, partition
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "chaos", "--duration", "2m", "--rate", "5", "--replicas", "2", "--nats-cluster", "3",
		"--kill-every", "4s", "--faults", strings.Join(disruptions, ","), "--settle-limit", "5m", "--json",
		// A lost event is published again once its stream's duplicate window has
		// passed: 1 min instead of 2 keeps the run short.
		"--duplicate-window", "60s")
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
	var exit *exec.ExitError
	if errors.As(runErr, &exit) {
		t.Fatalf("tripsaga chaos exited %d; stderr (tail):\n%s", exit.ExitCode(), tail)
	}
	require.NoError(t, runErr, "stderr:\n%s", tail)

	require.Empty(t, rep.Problems)
	require.Equal(t, 2, rep.Replicas)
	require.Equal(t, 3, rep.NATSCluster)
	require.Positive(t, rep.Trips)
	require.Zero(t, rep.Half, "half trips")
	require.Zero(t, rep.DuplicatesTotal, "duplicates: %v", rep.Duplicates)
	require.Zero(t, rep.Unsettled, "trips not settled")
	require.Zero(t, rep.OverlappingCallsTotal, "never two calls of one key in flight: %v", rep.OverlappingCalls)
	require.Len(t, rep.OverlappingCalls, 4, "read from every company")
	require.True(t, rep.Settled)
	require.Equal(t, rep.Trips, rep.Whole+rep.Empty)
	require.Equal(t, MailStats{ExactlyOne: rep.Trips}, rep.Mails, "one mail per trip")
	require.Positive(t, rep.Whole, "some trips confirmed")
	require.Positive(t, rep.Empty, "some trips turned down on purpose or by the faults")
	require.Positive(t, rep.FaultsTotal, "faults drawn: %v", rep.Faults)
	require.Positive(t, rep.KillsTotal, "kills: %v", rep.Kills)
	for _, k := range disruptions {
		require.Positive(t, rep.Disruptions[k], "disruptions of kind %s: %v (errors %v)", k, rep.Disruptions, rep.KillErrors)
	}
	require.NotNil(t, rep.Partitions, "partitions drawn")
	parts := 0
	for _, n := range rep.Partitions.Shapes {
		parts += n
	}
	require.GreaterOrEqual(t, parts, rep.Disruptions[DisruptPartition], "every partition counted by its shape: %+v", rep.Partitions)
	require.NotEmpty(t, rep.LostEvents, "acked events were deleted from their streams")
	require.Equal(t, len(rep.LostEvents), rep.LostFoundAgain, "every acked event deleted from its stream was published again: %+v", rep.LostEvents)
	require.Contains(t, rep.Victims, "nats-2")
	require.Contains(t, rep.Victims, "trips-2")
	require.NotContains(t, rep.Victims, "sim")
}
