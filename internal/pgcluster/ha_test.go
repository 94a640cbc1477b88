package pgcluster_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

// TestHAFailsOverToTheStandby: a pg_auto_failover pair starts with a
// primary and a synchronous standby; a row committed on the primary is on
// the standby (synchronous replication); once the primary's node is
// killed with SIGKILL the monitor promotes the standby, and the pair's
// multi-host URL (target_session_attrs=read-write) writes there, the row
// committed before the kill still present. The killed node, run again,
// rejoins as the new primary's standby, and a second failover
// ([HA.FailOver]) goes back to it, every row still there.
func TestHAFailsOverToTheStandby(t *testing.T) {
	testenv.PGAutoctl(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h, err := pgcluster.StartHA(ctx, pgcluster.HAConfig{Dir: filepath.Join(traversableTemp(t), "ha")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Stop() })

	first, err := h.Primary(ctx)
	require.NoError(t, err)
	require.Contains(t, pgcluster.HANodeNames, first)
	require.Equal(t, "ANY 1 (pgautofailover_standby_2)", query(t, h.URL, "SHOW synchronous_standby_names"))
	c, err := pgx.Connect(ctx, h.URL)
	require.NoError(t, err)
	_, err = c.Exec(ctx, "CREATE TABLE kept (v text)")
	require.NoError(t, err)
	_, err = c.Exec(ctx, "INSERT INTO kept VALUES ('before the kill')")
	require.NoError(t, err, "committed once the standby has it (synchronous replication)")
	c.Close(ctx)

	require.NoError(t, h.Kill(first))
	killed := time.Now()
	var writable time.Duration
	testenv.Eventually(t, func() bool {
		c, err := pgx.Connect(ctx, h.URL)
		if err != nil {
			return false
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctx, "INSERT INTO kept VALUES ('after the kill')")
		if err == nil {
			writable = time.Since(killed)
		}
		return err == nil
	}, "the standby takes writes after the primary's node is killed")
	t.Logf("writable again %s after the kill", writable.Round(100*time.Millisecond))
	second, err := h.Primary(ctx)
	require.NoError(t, err)
	require.NotEqual(t, first, second)
	require.Equal(t, "2", query(t, h.URL, "SELECT count(*)::text FROM kept"), "the row committed before the kill survived")

	require.NoError(t, h.Restart(first))
	require.NoError(t, h.WaitPair(ctx), "the killed node rejoins as the standby")
	st, err := h.States(ctx)
	require.NoError(t, err)
	for _, s := range st {
		want := "secondary"
		if s.Name == second {
			want = "primary"
		}
		require.Equal(t, want, s.Reported, "%+v", st)
	}
	c, err = pgx.Connect(ctx, h.URL)
	require.NoError(t, err)
	_, err = c.Exec(ctx, "INSERT INTO kept VALUES ('before the second kill')")
	require.NoError(t, err, "committed once the rejoined standby has it")
	c.Close(ctx)

	f, err := h.FailOver(ctx)
	require.NoError(t, err)
	require.Equal(t, pgcluster.Failover{Killed: second, Promoted: first, At: f.At, Writable: f.Writable, Rejoined: f.Rejoined}, f)
	require.Greater(t, f.Rejoined, f.Writable)
	t.Logf("second failover: writable again %s after the kill, %s rejoined as standby %s after it",
		f.Writable.Round(100*time.Millisecond), second, f.Rejoined.Round(100*time.Millisecond))
	require.Equal(t, "3", query(t, h.URL, "SELECT count(*)::text FROM kept"), "every row committed before the kills survived")
	require.NoError(t, h.WaitPair(ctx))
}
