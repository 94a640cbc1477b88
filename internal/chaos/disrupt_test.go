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
	require.Equal(t, []string{DisruptKill, DisruptLoseAcked}, got, "all without a cluster leaves out what needs one")

	_, err = ParseDisruptions("step-down", 0)
	require.ErrorContains(t, err, "step-down needs a NATS cluster")
	_, err = ParseDisruptions("kill,partitoin", 3)
	require.ErrorContains(t, err, `unknown kind "partitoin"`)
}
