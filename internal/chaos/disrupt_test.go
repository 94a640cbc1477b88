package chaos

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseDisruptions(t *testing.T) {
	got, err := ParseDisruptions("lose-acked, kill,kill", 0)
	require.NoError(t, err)
	require.Equal(t, []string{DisruptKill, DisruptLoseAcked}, got, "sorted, each once")

	got, err = ParseDisruptions("all", 3)
	require.NoError(t, err)
	require.ElementsMatch(t, Disruptions, got)

	got, err = ParseDisruptions("all", 0)
	require.NoError(t, err)
	require.Equal(t, []string{DisruptKill, DisruptLoseAcked, DisruptPartition}, got, "all without a cluster leaves out what needs one")

	_, err = ParseDisruptions("step-down", 0)
	require.ErrorContains(t, err, "step-down needs a NATS cluster")
	_, err = ParseDisruptions("kill,partitoin", 3)
	require.ErrorContains(t, err, `unknown kind "partitoin"`)
}

func TestParseDisruptionsOnReplicas(t *testing.T) {
	got, err := ParseDisruptionsOn("partition,kill", 0, 2)
	require.NoError(t, err)
	require.Equal(t, []string{DisruptKill, DisruptPartition}, got)

	_, err = ParseDisruptionsOn("kill, partition", 3, 1)
	require.ErrorContains(t, err, "partition needs --replicas 2 or more")

	got, err = ParseDisruptionsOn("all", 3, 1)
	require.NoError(t, err)
	require.NotContains(t, got, DisruptPartition, "all with one replica leaves the partition out")
	require.Contains(t, got, DisruptStepDown)

	got, err = ParseDisruptionsOn("all", 0, 2)
	require.NoError(t, err)
	require.Equal(t, []string{DisruptKill, DisruptLoseAcked, DisruptPartition}, got)

	_, err = ParseDisruptionsOn("step-down", 0, 2)
	require.ErrorContains(t, err, "step-down needs a NATS cluster")
}

func TestProcessOfAnInstance(t *testing.T) {
	for in, want := range map[string]string{"hotel": "hotel", "hotel-2": "hotel", "reconciler-12": "reconciler", "nats-1": "nats", "sim": "sim"} {
		require.Equal(t, want, processOf(in), in)
	}
}

// The partition's counts read the services' log lines as slog's text
// handler writes them (saga/liveness.go's messages and attributes).
func TestPartitionLogLinesAreRead(t *testing.T) {
	var b strings.Builder
	log := slog.New(slog.NewTextHandler(&b, nil)).With("service", "hotel")
	log.Error("saga: liveness: no beat confirmed by PostgreSQL for the fence bound: starting no company call until one is; peers may take this process's leases",
		"process_id", int32(7), "fence_after", 3*time.Second, "takeover_after", 6*time.Second)
	log.Warn("saga: took over a lease of a dead process", "trip_id", "T-1", "step", "hotel", "dead_process_id", int32(7))
	log.Warn("saga: took over a lease of a dead process", "trip_id", "T-2", "step", "hotel", "dead_process_id", int32(8))
	m := fenceLine.FindAllStringSubmatch(b.String(), -1)
	require.Len(t, m, 1)
	require.Equal(t, "7", m[0][1])
	var dead []string
	for _, m := range takeoverLine.FindAllStringSubmatch(b.String(), -1) {
		dead = append(dead, m[1])
	}
	require.Equal(t, []string{"7", "8"}, dead)
}
