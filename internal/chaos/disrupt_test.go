package chaos

import (
	"testing"

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
