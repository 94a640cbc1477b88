package sagatest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/pgcluster"
)

// TestClustersLeftBehindAreStopped (issue 19 item 8): a test binary killed
// before Main stopped its private cluster left the server running and its
// folder in the temp folder, run after run. The next binary's first
// AdminURL stops such a server and removes its folder when the binary
// that owned it is gone, and leaves alone one whose owner still runs.
func TestClustersLeftBehindAreStopped(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	require.NoError(t, os.Chmod(base, 0o711)) // the postgres OS user (as root) reaches it
	gone := exec.Command("true")
	require.NoError(t, gone.Run()) // its pid names no process now
	start := func(name string, owner int) (string, *pgcluster.Cluster) {
		t.Helper()
		dir := filepath.Join(base, clusterDirPrefix+name)
		require.NoError(t, os.Mkdir(dir, 0o711))
		require.NoError(t, os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(owner)), 0o644))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(dir, "pg")})
		require.NoError(t, err)
		return dir, c
	}
	leftDir, left := start("left", gone.Process.Pid)
	keptDir, kept := start("kept", os.Getppid()) // an owner that runs
	t.Cleanup(func() { _ = kept.Stop() })
	require.True(t, left.Alive())

	sweepLeftBehind(base)
	require.False(t, left.Alive(), "the server whose owner is gone is stopped")
	require.NoDirExists(t, leftDir, "and its folder removed")
	require.True(t, kept.Alive(), "a server whose owner runs is left alone")
	require.DirExists(t, keptDir)
}
