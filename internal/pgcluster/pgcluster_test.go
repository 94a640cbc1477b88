package pgcluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

// traversableTemp returns a new folder the postgres OS user can enter (run
// as root): the test made it, so it may choose its mode. t.TempDir's
// parent is 0700, which would send the cluster to RootHome.
func traversableTemp(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgcluster-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o711))
	return dir
}

func start(t *testing.T, cfg pgcluster.Config) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

func query(t *testing.T, url, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func execSQL(t *testing.T, url, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestRestartAfterKill: a postmaster killed with SIGKILL is seen dead (even
// while it is an unreaped zombie) and Restart brings the same cluster back
// on the same port, data intact.
func TestRestartAfterKill(t *testing.T) {
	c := start(t, pgcluster.Config{Dir: filepath.Join(traversableTemp(t), "pg"), Durable: true})
	execSQL(t, c.URL, "CREATE TABLE kept (x int)")
	old := c.Pid()
	if !c.Alive() {
		t.Fatal("a started cluster is not alive")
	}
	require.NoError(t, syscall.Kill(old, syscall.SIGKILL))
	testenv.Eventually(t, func() bool { return !c.Alive() }, "the killed postmaster is seen dead")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	testenv.Eventually(t, func() bool { err = c.Restart(ctx); return err == nil }, "Restart succeeds")
	if !c.Alive() || c.Pid() == old {
		t.Fatalf("after Restart: alive %v, pid %d (was %d)", c.Alive(), c.Pid(), old)
	}
	if got := query(t, c.URL, "SELECT to_regclass('kept')::text"); got != "kept" {
		t.Fatalf("table after restart: %q", got)
	}
}

// TestAdoptsARunningServer: a second Start on a cluster whose server runs
// (its runner was killed) adopts it and says so; a second Start after the
// postmaster was killed starts a new one instead of adopting the dead pid.
func TestAdoptsARunningServer(t *testing.T) {
	dir := filepath.Join(traversableTemp(t), "pg")
	first := start(t, pgcluster.Config{Dir: dir})
	if first.Adopted {
		t.Fatal("a fresh cluster says it was adopted")
	}
	second := start(t, pgcluster.Config{Dir: dir})
	if !second.Adopted || second.Pid() != first.Pid() || second.Port != first.Port {
		t.Fatalf("second Start: adopted %v pid %d port %d; first pid %d port %d", second.Adopted, second.Pid(), second.Port, first.Pid(), first.Port)
	}
	require.NoError(t, syscall.Kill(first.Pid(), syscall.SIGKILL))
	testenv.Eventually(t, func() bool { return !first.Alive() }, "the killed postmaster is seen dead")
	var third *pgcluster.Cluster
	testenv.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: dir})
		if err != nil {
			return false // the dead server's backends may still be exiting
		}
		third = c
		return true
	}, "Start after the kill")
	t.Cleanup(func() { _ = third.Stop() })
	if third.Adopted || third.Pid() == first.Pid() {
		t.Fatalf("Start after the postmaster died adopted %v pid %d (dead pid %d)", third.Adopted, third.Pid(), first.Pid())
	}
	query(t, third.URL, "SELECT 'ok'")
}

func modes(t *testing.T, paths ...string) map[string]os.FileMode {
	t.Helper()
	m := map[string]os.FileMode{}
	for _, p := range paths {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		m[p] = fi.Mode()
	}
	return m
}

// TestRootNeverChmodsParents (issue 7 item 4): run as root with a cluster
// folder under a 0700 folder, Start changes no folder above Dir: the
// cluster lives in a folder made for postgres, linked from Dir/data, and a
// later Start finds it there again. Outside the temp folder that folder is
// under RootHome; inside it, in the temp folder, and once Dir is removed
// the next such Start removes it.
func TestRootNeverChmodsParents(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root hands the cluster to the postgres OS user")
	}
	outside, err := os.MkdirTemp("/var/tmp", "pgcluster-test-")
	if err != nil {
		t.Skip("no /var/tmp for a folder outside the temp folder:", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(outside) })
	for _, tc := range []struct{ name, base, wantHome string }{
		{"outside the temp folder", outside, pgcluster.RootHome + "/"},
		{"inside the temp folder", t.TempDir(), filepath.Join(os.TempDir(), pgcluster.TempHomePrefix)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			priv := filepath.Join(tc.base, "priv")
			require.NoError(t, os.Mkdir(priv, 0o700))
			dir := filepath.Join(priv, "x", "pg")
			before := modes(t, tc.base, priv, filepath.Dir(tc.base))

			c := start(t, pgcluster.Config{Dir: dir})
			home := filepath.Dir(c.DataDir)
			t.Cleanup(func() { _ = os.RemoveAll(home) })
			if after := modes(t, tc.base, priv, filepath.Dir(tc.base)); !equalModes(before, after) {
				t.Fatalf("modes changed: before %v, after %v", before, after)
			}
			if !strings.HasPrefix(c.DataDir, tc.wantHome) {
				t.Fatalf("DataDir %s does not start with %s", c.DataDir, tc.wantHome)
			}
			if target, err := os.Readlink(filepath.Join(dir, "data")); err != nil || target != c.DataDir {
				t.Fatalf("%s/data links to %q (%v), want %s", dir, target, err, c.DataDir)
			}
			execSQL(t, c.URL, "CREATE TABLE kept (x int)")
			require.NoError(t, c.Stop())

			again := start(t, pgcluster.Config{Dir: dir})
			if again.DataDir != c.DataDir {
				t.Fatalf("second Start used %s, first %s", again.DataDir, c.DataDir)
			}
			if got := query(t, again.URL, "SELECT to_regclass('kept')::text"); got != "kept" {
				t.Fatalf("table after a second Start: %q", got)
			}
			if after := modes(t, tc.base, priv, filepath.Dir(tc.base)); !equalModes(before, after) {
				t.Fatalf("modes changed: before %v, after %v", before, after)
			}
			require.NoError(t, again.Stop())
			if tc.base == outside {
				return
			}
			// The temporary Dir goes; the next temporary cluster sweeps
			// its folder away.
			require.NoError(t, os.RemoveAll(filepath.Dir(dir)))
			other := start(t, pgcluster.Config{Dir: filepath.Join(priv, "y", "pg")})
			t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(other.DataDir)) })
			if _, err := os.Stat(home); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the folder of a removed temporary Dir is still there: %v", err)
			}
		})
	}
}

// TestRootRefusesAnUnreachableCluster: a cluster already made in a folder
// postgres cannot reach is refused with ErrUnreachable, modes untouched.
func TestRootRefusesAnUnreachableCluster(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root hands the cluster to the postgres OS user")
	}
	base := t.TempDir()
	priv := filepath.Join(base, "priv")
	dir := filepath.Join(priv, "pg")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "data"), 0o700))
	require.NoError(t, os.Chmod(priv, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "PG_VERSION"), []byte("15\n"), 0o600))
	before := modes(t, base, priv)
	_, err := pgcluster.Start(context.Background(), pgcluster.Config{Dir: dir})
	if !errors.Is(err, pgcluster.ErrUnreachable) {
		t.Fatalf("Start: %v, want ErrUnreachable", err)
	}
	if !strings.Contains(err.Error(), "chmod o+x") {
		t.Fatalf("the error does not say what to do: %v", err)
	}
	if after := modes(t, base, priv); !equalModes(before, after) {
		t.Fatalf("modes changed: before %v, after %v", before, after)
	}
}

func equalModes(a, b map[string]os.FileMode) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestPasswordsRequired: every connection must give its role's password
// (scram-sha-256), and URL carries the superuser's. A cluster made by an
// earlier version (pg_hba "trust", no password file) is given a password
// and the rule when it is started again, its data kept.
func TestPasswordsRequired(t *testing.T) {
	dir := filepath.Join(traversableTemp(t), "pg")
	c := start(t, pgcluster.Config{Dir: dir})
	require.NotEmpty(t, c.Password)
	execSQL(t, c.URL, "CREATE TABLE kept (x int)")
	refused := func(c *pgcluster.Cluster) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, u := range []string{
			fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port),
			fmt.Sprintf("postgres://postgres:wrong@127.0.0.1:%d/postgres?sslmode=disable", c.Port),
		} {
			conn, err := pgx.Connect(ctx, u)
			if err == nil {
				conn.Close(ctx)
				t.Fatalf("%s: connected without the superuser's password", u)
			}
		}
	}
	refused(c)

	// As an earlier version left it.
	require.NoError(t, c.Stop())
	require.NoError(t, os.WriteFile(filepath.Join(c.DataDir, "pg_hba.conf"), []byte("local all all trust\nhost all all 127.0.0.1/32 trust\n"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(dir, pgcluster.PasswordFile)))
	again := start(t, pgcluster.Config{Dir: dir})
	require.NotEqual(t, c.Password, again.Password)
	if got := query(t, again.URL, "SELECT to_regclass('kept')::text"); got != "kept" {
		t.Fatalf("table after the upgrade: %q", got)
	}
	refused(again)
}

// TestClockOffset runs a cluster 10 s ahead and one 10 s behind the
// machine's clock (libfaketime) and reads their now() and
// clock_timestamp(): each is off by the offset, within a second.
func TestClockOffset(t *testing.T) {
	testenv.Faketime(t)
	for _, offset := range []time.Duration{10 * time.Second, -10 * time.Second} {
		t.Run(offset.String(), func(t *testing.T) {
			c := start(t, pgcluster.Config{Dir: filepath.Join(traversableTemp(t), "pg"), ClockOffset: offset})
			for _, fn := range []string{"now()", "clock_timestamp()"} {
				before := time.Now()
				got, err := time.Parse(time.RFC3339Nano, query(t, c.URL, "SELECT to_char("+fn+" AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"))
				require.NoError(t, err)
				after := time.Now()
				require.True(t, got.After(before.Add(offset-time.Second)) && got.Before(after.Add(offset+time.Second)),
					"%s of a cluster %s off reads %s; the machine's clock read %s..%s", fn, offset, got, before, after)
			}
		})
	}
}
