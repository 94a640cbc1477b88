package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/redact"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// buildTripsaga builds this command into a temp folder (the go build
// cache makes a second build quick).
func buildTripsaga(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tripsaga")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// run runs the binary to its end and returns stdout, stderr and the exit
// code.
func run(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = withoutStackEnv()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return o.String(), e.String(), code
}

// withoutStackEnv is the test's environment without the variables that
// would point a command at some other system.
func withoutStackEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k != "NATS_URL" && k != "DATABASE_URL" && k != "OPERATOR_TOKEN" && k != "RECONCILER_URL" {
			env = append(env, kv)
		}
	}
	return env
}

type upProc struct {
	cmd      *exec.Cmd
	out, err syncBuffer
	done     chan struct{}
	code     int
}

// startUp starts `tripsaga up --dir dir --port 0` and waits until it says
// everything runs.
func startUp(t *testing.T, bin, dir string) *upProc {
	t.Helper()
	u := &upProc{done: make(chan struct{})}
	u.cmd = exec.Command(bin, "up", "--dir", dir, "--port", "0")
	u.cmd.Env = withoutStackEnv()
	u.cmd.Stdout, u.cmd.Stderr = &u.out, &u.err
	require.NoError(t, u.cmd.Start())
	go func() {
		_ = u.cmd.Wait()
		u.code = u.cmd.ProcessState.ExitCode()
		close(u.done)
	}()
	t.Cleanup(func() {
		_ = u.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-u.done:
		case <-time.After(60 * time.Second):
			_ = u.cmd.Process.Kill()
		}
	})
	testenv.Eventually(t, func() bool {
		select {
		case <-u.done:
			t.Fatalf("up exited (%d):\n%s\n%s", u.code, u.out.String(), u.err.String())
		default:
		}
		return strings.Contains(u.out.String(), "Ctrl-C stops everything.")
	}, "up is running:\n%s\n%s", &u.out, &u.err)
	return u
}

func (u *upProc) exited() bool {
	select {
	case <-u.done:
		return true
	default:
		return false
	}
}

func postmasterPid(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "pg", "data", "postmaster.pid"))
	require.NoError(t, err)
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	return pid
}

// alive: the process exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

func modeOf(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	require.NoError(t, err)
	return fi.Mode()
}

// TestUp runs the real `tripsaga up` binary (child processes, a private
// PostgreSQL cluster, embedded NATS) in priv/x under a 0700 priv, and
// checks issue 7's items on it, in order: 6 (export lines, up.env,
// envFromUpDir), 1 (a second up on the folder is refused), 14 and 6
// (replay --dir prints its result once), 2 (the postmaster killed with
// SIGKILL is restarted and up says so), 3 (up killed with SIGKILL leaves
// the postmaster; the next up adopts it, says so, and stops it on Ctrl-C)
// and 4 (no parent folder's mode changed; as root the cluster lives where
// postgres can reach it, linked from x/pg/data).
func TestUp(t *testing.T) {
	bin := buildTripsaga(t)
	base := t.TempDir()
	priv := filepath.Join(base, "priv")
	require.NoError(t, os.Mkdir(priv, 0o700))
	dir := filepath.Join(priv, "x")
	baseMode, privMode := modeOf(t, base), modeOf(t, priv)
	stopPostmaster := func() {}
	t.Cleanup(func() { stopPostmaster() })
	tempHome := filepath.Join(os.TempDir(), pgcluster.TempHomePrefix)
	if os.Geteuid() == 0 {
		t.Cleanup(func() {
			if target, err := os.Readlink(filepath.Join(dir, "pg", "data")); err == nil && strings.HasPrefix(target, tempHome) {
				_ = os.RemoveAll(filepath.Dir(target))
			}
		})
	}

	up := startUp(t, bin, dir)
	firstPid := postmasterPid(t, dir)
	stopPostmaster = func() { // if the test failed with it running
		b, err := os.ReadFile(filepath.Join(dir, "pg", "data", "postmaster.pid"))
		if err != nil {
			return
		}
		line, _, _ := strings.Cut(string(b), "\n")
		if p, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && alive(p) {
			_ = syscall.Kill(p, syscall.SIGQUIT) // immediate shutdown
		}
	}

	t.Run("item 6: every URL as export lines, in up.env, found by envFromUpDir; no password on stdout", func(t *testing.T) {
		env, err := envFromUpDir(dir)
		require.NoError(t, err)
		for _, k := range []string{"NATS_URL", "DATABASE_URL", "HOTEL_URL", "PAYMENTS_URL", "CARS_URL", "MAIL_URL", "TRIPS_URL"} {
			if env[k] == "" {
				t.Errorf("envFromUpDir: no %s", k)
			}
			if line := stack.ExportLine(k, redact.URL(env[k])); !strings.Contains(up.out.String(), line+"\n") {
				t.Errorf("up did not print %s", line)
			}
		}
		// Issue 19 item 6: the administrator's password was printed in
		// full on the DATABASE_URL line, so it landed in CI logs.
		u, err := url.Parse(env["DATABASE_URL"])
		require.NoError(t, err)
		pw, ok := u.User.Password()
		require.True(t, ok && pw != "", "up.env's DATABASE_URL holds the password")
		require.NotContains(t, up.out.String(), pw, "no password on up's stdout")
		require.Contains(t, up.out.String(), ". "+filepath.Join(dir, stack.EnvFile)+" sets it")
		if _, err := envFromUpDir(t.TempDir()); !errors.Is(err, errNoUp) {
			t.Errorf("envFromUpDir on a folder without up: %v, want errNoUp", err)
		}
	})

	t.Run("an operators' token made by up: in up.env, masked on stdout, read by the tools' --dir", func(t *testing.T) {
		// A trial found every action refused with "OPERATOR_TOKEN is not
		// set" on an up started without one, and nothing saying why.
		env, err := envFromUpDir(dir)
		require.NoError(t, err)
		tok := env["OPERATOR_TOKEN"]
		require.Len(t, tok, 32, "a token of 16 random bytes, in hex, in up.env")
		require.NotContains(t, up.out.String(), tok, "no token on up's stdout")
		require.Contains(t, up.out.String(), stack.ExportLine("OPERATOR_TOKEN", redact.Mask))
		require.Contains(t, up.out.String(), "operators' token: made for this up")
		// The reconciler takes it: the action is judged (a trip nobody
		// knows of is refused, 404), not refused for want of a token.
		_, stderr, code := run(t, bin, "incidents", "retry", "T-NOPE", "--service", "payment", "--reason", "trial", "--dir", dir)
		require.Equal(t, 1, code, stderr)
		require.Contains(t, stderr, "trip T-NOPE is not known", stderr)
		require.NotContains(t, stderr, "OPERATOR_TOKEN is not set")
	})

	t.Run("item 1: a second up on the folder is refused, whatever the port", func(t *testing.T) {
		for _, port := range []string{"0", "47400"} {
			_, stderr, code := run(t, bin, "up", "--dir", dir, "--port", port)
			if code == 0 || !strings.Contains(stderr, "folder in use") || !strings.Contains(stderr, dir) ||
				!strings.Contains(stderr, "process "+strconv.Itoa(up.cmd.Process.Pid)) {
				t.Fatalf("second up --port %s: exit %d, stderr:\n%s", port, code, stderr)
			}
		}
		if up.exited() {
			t.Fatal("the first up exited")
		}
		if p := postmasterPid(t, dir); p != firstPid || !alive(p) {
			t.Fatalf("the first up's PostgreSQL changed: pid %d (was %d), alive %v", p, firstPid, alive(p))
		}
	})

	t.Run("items 6 and 14: replay --dir finds up and prints its result once", func(t *testing.T) {
		stdout, stderr, code := run(t, bin, "replay", "reconciler", "--dir", dir)
		if code != 0 {
			t.Fatalf("replay: exit %d\n%s\n%s", code, stdout, stderr)
		}
		if n := strings.Count(stdout+stderr, "replayed reconciler"); n != 1 {
			t.Fatalf("the result is printed %d times:\nstdout:\n%s\nstderr:\n%s", n, stdout, stderr)
		}
		if strings.Contains(stderr, "replay done") {
			t.Fatalf("the result is logged too:\n%s", stderr)
		}
	})

	t.Run("item 2: the postmaster killed with SIGKILL is restarted, and up says so", func(t *testing.T) {
		require.NoError(t, syscall.Kill(firstPid, syscall.SIGKILL))
		testenv.Eventually(t, func() bool { return strings.Contains(up.err.String(), "PostgreSQL restarted") }, "up says PostgreSQL restarted:\n%s", &up.err)
		if !strings.Contains(up.err.String(), "PostgreSQL exited; restarting it") {
			t.Fatalf("up did not say PostgreSQL exited:\n%s", up.err.String())
		}
		if p := postmasterPid(t, dir); p == firstPid || !alive(p) {
			t.Fatalf("postmaster pid %d (killed %d), alive %v", p, firstPid, alive(p))
		}
		env, err := envFromUpDir(dir)
		require.NoError(t, err)
		testenv.Eventually(t, func() bool {
			resp, err := http.Get(env["TRIPS_URL"] + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}, "trips ready again after PostgreSQL restarted")
	})

	t.Run("item 3: up killed with SIGKILL leaves the postmaster; the next up adopts it and says so", func(t *testing.T) {
		pid := postmasterPid(t, dir)
		require.NoError(t, up.cmd.Process.Signal(syscall.SIGKILL))
		<-up.done
		_, err := envFromUpDir(dir)
		require.ErrorIs(t, err, errNoUp, "the up.env of a killed up is not taken for a running one")
		if !alive(pid) {
			t.Fatal("the postmaster died with up")
		}
		next := startUp(t, bin, dir)
		if !strings.Contains(next.out.String(), "adopted: this PostgreSQL server was already running") {
			t.Fatalf("the next up does not say it adopted the server:\n%s", next.out.String())
		}
		if !strings.Contains(next.err.String(), "adopted a PostgreSQL server left running") {
			t.Fatalf("the next up does not log the adoption:\n%s", next.err.String())
		}
		if p := postmasterPid(t, dir); p != pid {
			t.Fatalf("postmaster pid %d, want the adopted %d", p, pid)
		}
		require.NoError(t, next.cmd.Process.Signal(syscall.SIGINT))
		<-next.done
		if next.code != 0 {
			t.Fatalf("up after Ctrl-C: exit %d\n%s", next.code, next.err.String())
		}
		testenv.Eventually(t, func() bool { return !alive(pid) }, "Ctrl-C stops the adopted postmaster")
		if _, running, _ := stack.Running(dir); running {
			t.Fatal("the folder is still locked after up stopped")
		}
	})

	t.Run("item 4: no parent folder's mode changed", func(t *testing.T) {
		if m := modeOf(t, base); m != baseMode {
			t.Errorf("%s: mode %v, was %v", base, m, baseMode)
		}
		if m := modeOf(t, priv); m != privMode {
			t.Errorf("%s: mode %v, was %v", priv, m, privMode)
		}
		if os.Geteuid() != 0 {
			return
		}
		// In the temp folder, as t.TempDir is (pgcluster's tests cover
		// RootHome for other folders).
		target, err := os.Readlink(filepath.Join(dir, "pg", "data"))
		if err != nil || !strings.HasPrefix(target, tempHome) {
			t.Fatalf("as root under a 0700 folder, %s/pg/data links to %q (%v), want a folder %s*", dir, target, err, tempHome)
		}
	})
}

// TestUpNamesThePortInUse (issue 7 item 5): up on a port range with a
// port in use names the port and suggests --port.
func TestUpNamesThePortInUse(t *testing.T) {
	bin := buildTripsaga(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	_, stderr, code := run(t, bin, "up", "--dir", filepath.Join(t.TempDir(), "d"), "--port", strconv.Itoa(port))
	if code == 0 || !strings.Contains(stderr, fmt.Sprintf("port %d (for NATS) is in use", port)) || !strings.Contains(stderr, "--port") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
}

// TestUpRefusesBadReplicas (issue 6 items 1 and 2): --replicas below 1
// and a two-node cluster are refused before anything starts, and the help
// says how the replicas and the cluster are laid out.
func TestUpRefusesBadReplicas(t *testing.T) {
	for args, want := range map[string]string{
		"--replicas 0":     "--replicas 0: want 1 or more",
		"--nats-cluster 2": "--nats-cluster 2: want 1",
	} {
		var out bytes.Buffer
		cmd := rootCmd()
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"up", "--dir", t.TempDir()}, strings.Fields(args)...))
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("up %s: %v, want %q", args, err, want)
		}
	}
	var out bytes.Buffer
	cmd := rootCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"up", "--help"})
	require.NoError(t, cmd.Execute())
	for _, want := range []string{"--replicas", "--nats-cluster", "hotel-2", "nats-1", "TRIPSAGA_INSTANCE", "STREAM_REPLICAS"} {
		require.Contains(t, out.String(), want)
	}
}

// TestReplayListsProjections (issue 7 item 14): replay of an unknown
// projection lists what can be replayed; replay alone lists them.
func TestReplayListsProjections(t *testing.T) {
	var out bytes.Buffer
	cmd := rootCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"replay", "trips"})
	err := cmd.Execute()
	if !errors.Is(err, errUnknownProjection) || !strings.Contains(err.Error(), "reconciler  the reconciler's trip_view") ||
		strings.Contains(err.Error(), "reconciler: unknown projection") {
		t.Fatalf("replay trips: %v", err)
	}
	out.Reset()
	cmd = rootCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"replay"})
	require.NoError(t, cmd.Execute())
	if !strings.Contains(out.String(), "projections that can be replayed") || !strings.Contains(out.String(), "reconciler") {
		t.Fatalf("replay alone printed:\n%s", out.String())
	}
}

// TestHealth (issue 7 item 17): `tripsaga health URL` exits 0 on a 2xx
// answer, with an error otherwise; a URL without a path checks /readyz.
func TestHealth(t *testing.T) {
	ready := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path != "/readyz":
			http.NotFound(w, r)
		case ready:
			_, _ = w.Write([]byte("ready\n"))
		default:
			http.Error(w, "not ready: nats", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	exec := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := rootCmd()
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"health"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	if out, err := exec(srv.URL); err != nil || !strings.Contains(out, "200 OK") {
		t.Fatalf("health %s: %q, %v", srv.URL, out, err)
	}
	if _, err := exec(srv.URL + "/readyz"); err != nil {
		t.Fatalf("health /readyz: %v", err)
	}
	ready = false
	if _, err := exec(srv.URL); err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "not ready: nats") {
		t.Fatalf("health of a 503: %v", err)
	}
	if _, err := exec(srv.URL + "/nope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("health of a 404: %v", err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := "http://" + l.Addr().String()
	l.Close()
	if _, err := exec(closed); err == nil {
		t.Fatal("health of a closed port succeeded")
	}
	if _, err := exec("127.0.0.1:8080"); err == nil || !strings.Contains(err.Error(), "http://") {
		t.Fatalf("health without a scheme: %v", err)
	}
}

// TestDemoSaysTheKillIsTheSituation (issue 7 item 15): the demo's kill of a
// service says, before the supervisor's "process exited; restarting"
// warning, that the kill is the situation being shown, and says when the
// process is back. A real stack, as the demo runs it.
func TestDemoSaysTheKillIsTheSituation(t *testing.T) {
	bin := buildTripsaga(t)
	dir, err := os.MkdirTemp("", "demo-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var errw syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := stack.Start(ctx, stack.Config{Dir: dir, Binary: bin, Logger: demoLogger(&errw)})
	require.NoError(t, err)
	defer s.Stop()
	require.NoError(t, demoEnv(s, &errw).Kill(ctx, "payment"))
	got := errw.String()
	note := strings.Index(got, "killing payment")
	warn := strings.Index(got, "process exited; restarting")
	back := strings.Index(got, "payment is back")
	if note < 0 || warn < 0 || back < 0 || note > warn || warn > back {
		t.Fatalf("want the note, then the supervisor's warning, then the return:\n%s", got)
	}
	for _, want := range []string{"on purpose", "this is the situation being shown, not a failure", `cause="Stack.Kill, on purpose"`} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
}

// TestEnvForTool: without --dir the process environment is used when it
// has what the command needs; what is missing is named, with --dir as the
// way to point at a running up.
func TestEnvForTool(t *testing.T) {
	t.Chdir(t.TempDir()) // no .tripsaga here
	t.Setenv("NATS_URL", "")
	t.Setenv("DATABASE_URL", "postgres://example/db")
	env, err := envForTool("", "DATABASE_URL")
	if err != nil || env.DatabaseURL != "postgres://example/db" {
		t.Fatalf("envForTool: %+v, %v", env, err)
	}
	_, err = envForTool("", "NATS_URL", "DATABASE_URL")
	if err == nil || !strings.Contains(err.Error(), "NATS_URL is not set") || !strings.Contains(err.Error(), "--dir") {
		t.Fatalf("envForTool without NATS_URL: %v", err)
	}
	if _, err := envForTool(t.TempDir(), "DATABASE_URL"); !errors.Is(err, errNoUp) {
		t.Fatalf("envForTool with a --dir where no up runs: %v", err)
	}

	// Issue 19 item 5: an up that was killed leaves .tripsaga/up.env
	// behind and no lock; the tools said only "RECONCILER_URL is not
	// set", as if nothing had ever run.
	require.NoError(t, os.Mkdir(defaultUpDir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(defaultUpDir, stack.EnvFile), []byte("export RECONCILER_URL=http://127.0.0.1:1\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(defaultUpDir, stack.LockFile), nil, 0o600))
	t.Setenv("RECONCILER_URL", "")
	for name, err := range map[string]error{
		"envForTool":    func() error { _, err := envForTool("", "NATS_URL"); return err }(),
		"reconcilerURL": func() error { _, err := reconcilerURL(""); return err }(),
	} {
		if err == nil || !strings.Contains(err.Error(), "the tripsaga up that wrote ") || !strings.Contains(err.Error(), "is not running") {
			t.Errorf("%s with a stale %s: %v", name, stack.EnvFile, err)
		}
	}
}

// TestUpStopsOnAChildThatFailsItsStart (issue 19 item 2): a child that
// refuses its configuration (here the trips service's unreadable
// CANCELLATION_POLICY_FILE) fails every start the same way; up used to
// restart it forever and never finish starting. Now up stops everything
// and exits non-zero with the child's last line, and leaves no
// PostgreSQL running.
func TestUpStopsOnAChildThatFailsItsStart(t *testing.T) {
	bin := buildTripsaga(t)
	dir := filepath.Join(t.TempDir(), "d")
	policy := filepath.Join(t.TempDir(), "no-such-policy.json")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "up", "--dir", dir, "--port", "0")
	cmd.Env = append(withoutStackEnv(), "CANCELLATION_POLICY_FILE="+policy)
	var o, e syncBuffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "up ended: stdout:\n%s\nstderr:\n%s", o.String(), e.String())
	require.NotZero(t, exit.ExitCode())
	stderr := e.String()
	want := fmt.Sprintf("trips failed its start %d times in a row, each time with: tripsaga: trips: ", stack.GiveUpAfter)
	require.Contains(t, stderr, want, "stderr:\n%s", stderr)
	require.Contains(t, stderr, "CANCELLATION_POLICY_FILE="+policy)
	require.NotContains(t, o.String(), "Ctrl-C stops everything", "up said everything runs")
	if b, err := os.ReadFile(filepath.Join(dir, "pg", "data", "postmaster.pid")); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		if p, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && alive(p) {
			_ = syscall.Kill(p, syscall.SIGQUIT)
			t.Fatalf("PostgreSQL (pid %d) still runs after up exited", p)
		}
	}
}
