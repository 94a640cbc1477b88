package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
)

var binary string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "stack-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "tripsaga")
	build := exec.Command("go", "build", "-o", binary, "../../cmd/tripsaga")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "stack test: build:", err)
		return 1
	}
	return m.Run()
}

// syncBuffer is a log sink the supervisor and the test share.
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

// tempDir returns a folder the postgres OS user can reach when the test
// runs as root (t.TempDir's parent is 0700).
func tempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "stack-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o711))
	return dir
}

func startStack(t *testing.T, dir string, log io.Writer) *Stack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{
		Dir: dir, Binary: binary, Durable: true,
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// bookConfirmed books a trip and waits until it is confirmed.
func bookConfirmed(t *testing.T, s *Stack) {
	t.Helper()
	day := time.Now().AddDate(0, 0, 30)
	body := fmt.Sprintf(`{"traveler":{"name":"Ada Example","email":"ada@example.com"},"hotel":{"property_id":"P-100","check_in":%q,"nights":2},"car":{"car_class":"compact","pickup":%q,"return":%q},"payment":{"card_token":"tok_visa_ok","amount_cents":33000,"currency":"USD"}}`,
		day.Format(time.DateOnly), day.Format(time.DateOnly), day.AddDate(0, 0, 2).Format(time.DateOnly))
	var id string
	testenv.Eventually(t, func() bool {
		req, _ := http.NewRequest(http.MethodPost, s.URL("trips")+"/trips", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Prefer", "wait=0")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var tr struct {
			TripID string `json:"trip_id"`
		}
		if resp.StatusCode/100 != 2 || json.NewDecoder(resp.Body).Decode(&tr) != nil {
			return false
		}
		id = tr.TripID
		return id != ""
	}, "POST /trips accepted")
	testenv.Eventually(t, func() bool {
		resp, err := http.Get(s.URL("trips") + "/trips/" + id)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var tr struct {
			Status string `json:"status"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&tr)
		return tr.Status == "confirmed"
	}, "trip "+id+" confirmed")
}

func allReady(t *testing.T, s *Stack) {
	t.Helper()
	for _, name := range Processes {
		require.NoError(t, s.WaitReady(context.Background(), name))
	}
}

// TestStackSupervisesItsFolderAndDependencies runs one real stack (child
// processes, private PostgreSQL, embedded NATS) and checks, in order:
// issue 7 item 1 (a second stack on the folder is refused, whatever the
// port), item 6 (the env file), item 2 (PostgreSQL killed with SIGKILL,
// and NATS stopped, are restarted and said so) and that Stop frees the
// folder.
func TestStackSupervisesItsFolderAndDependencies(t *testing.T) {
	dir := tempDir(t)
	var log syncBuffer
	s := startStack(t, dir, &log)

	t.Run("a process keeps its socket while it restarts, so no other program takes its port", func(t *testing.T) {
		addr := s.Addr["car"]
		if _, err := s.Kill("car"); err != nil {
			t.Fatalf("kill car: %v", err)
		}
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			t.Fatalf("%s could be taken while car was down", addr)
		}
		require.NoError(t, s.WaitReady(context.Background(), "car"))
		require.Equal(t, addr, s.Addr["car"])
		bookConfirmed(t, s)
	})

	t.Run("a second stack on the folder is refused", func(t *testing.T) {
		for _, port := range []int{0, 47400} {
			_, err := Start(context.Background(), Config{Dir: dir, Binary: binary, BasePort: port})
			if !errors.Is(err, ErrDirInUse) {
				t.Fatalf("second Start (port %d): %v, want ErrDirInUse", port, err)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("process %d", os.Getpid())) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("the refusal does not name the folder and the process holding it: %v", err)
			}
		}
		pid, running, err := Running(dir)
		if err != nil || !running || pid != os.Getpid() {
			t.Fatalf("Running(%s) = %d, %v, %v; want %d, true", dir, pid, running, err, os.Getpid())
		}
		// The refused Start stopped nothing of the running one.
		allReady(t, s)
	})

	t.Run("the env file names every URL", func(t *testing.T) {
		env, err := ReadEnvFile(dir)
		require.NoError(t, err)
		for k, v := range s.Env() {
			if env[k] != v {
				t.Errorf("%s: file has %q, stack has %q", k, env[k], v)
			}
		}
		for _, k := range []string{"NATS_URL", "DATABASE_URL", "HOTEL_URL", "PAYMENTS_URL", "CARS_URL", "MAIL_URL", "TRIPS_URL"} {
			if env[k] == "" {
				t.Errorf("%s missing from %s", k, EnvFile)
			}
		}
	})

	t.Run("PostgreSQL killed with SIGKILL is restarted", func(t *testing.T) {
		old := s.pg.Pid()
		require.NoError(t, syscall.Kill(old, syscall.SIGKILL))
		testenv.Eventually(t, func() bool { return strings.Contains(log.String(), "PostgreSQL restarted") }, "the supervisor says PostgreSQL restarted")
		if !strings.Contains(log.String(), "PostgreSQL exited; restarting it") {
			t.Fatalf("the supervisor did not say PostgreSQL exited:\n%s", log.String())
		}
		if s.pg.Pid() == old || !s.pg.Alive() {
			t.Fatalf("postmaster pid %d (was %d), alive %v", s.pg.Pid(), old, s.pg.Alive())
		}
		allReady(t, s)
		bookConfirmed(t, s)
	})

	t.Run("embedded NATS stopped is restarted on its port with its streams", func(t *testing.T) {
		s.mu.Lock()
		ns := s.nats
		s.mu.Unlock()
		ns.Shutdown()
		testenv.Eventually(t, func() bool { return strings.Contains(log.String(), "embedded NATS restarted") }, "the supervisor says NATS restarted")
		nc, err := s.ConnectNATS(natsauth.Admin)
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		if _, err := js.Stream(context.Background(), "TRIPS"); err != nil {
			t.Fatalf("TRIPS stream after the restart: %v", err)
		}
		allReady(t, s)
		bookConfirmed(t, s)
	})

	s.Stop()
	if _, running, _ := Running(dir); running {
		t.Fatal("the folder is still locked after Stop")
	}
	if _, err := os.Stat(filepath.Join(dir, EnvFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s left after Stop: %v", EnvFile, err)
	}
}

// TestPortInUse (issue 7 item 5): a taken port of BasePort's range fails
// Start with a PortInUseError naming it, and leaves the folder free.
func TestPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	dir := tempDir(t)
	for base, want := range map[int]string{taken: "NATS", taken - 5: Processes[4]} {
		_, err := Start(context.Background(), Config{Dir: dir, Binary: binary, BasePort: base})
		var pe *PortInUseError
		if errors.As(err, &pe) && pe.Port < taken {
			continue // a neighbour of the taken port happens to be in use too
		}
		if !errors.As(err, &pe) || pe.Port != taken || pe.For != want {
			t.Fatalf("Start with BasePort %d: %v; want port %d (for %s) in use", base, err, taken, want)
		}
		if !strings.Contains(err.Error(), fmt.Sprint(taken)) {
			t.Fatalf("the error does not name the port: %v", err)
		}
		if _, running, _ := Running(dir); running {
			t.Fatal("the folder stays locked after a failed Start")
		}
	}
}

func TestLockIsExclusiveAndDiesWithItsHolder(t *testing.T) {
	dir := t.TempDir()
	if _, running, err := Running(dir); err != nil || running {
		t.Fatalf("Running on a fresh folder: %v, %v", running, err)
	}
	f, err := lockDir(dir)
	require.NoError(t, err)
	if _, err := lockDir(dir); !errors.Is(err, ErrDirInUse) {
		t.Fatalf("second lock: %v", err)
	}
	f.Close()
	if _, running, _ := Running(dir); running {
		t.Fatal("Running after the lock's file was closed")
	}
	g, err := lockDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	g.Close()
}

func TestEnvFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	want := map[string]string{"NATS_URL": "nats://127.0.0.1:1", "DATABASE_URL": "postgres://u@h:5/db?sslmode=disable&x=it's", "TRIPS_URL": ""}
	var b strings.Builder
	b.WriteString("# comment\n\n")
	for _, k := range EnvNames(want) {
		b.WriteString(ExportLine(k, want[k]) + "\n")
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, EnvFile), []byte(b.String()), 0o644))
	got, err := ReadEnvFile(dir)
	require.NoError(t, err)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
	// What the shell makes of the same file.
	out, err := exec.Command("sh", "-c", ". "+filepath.Join(dir, EnvFile)+` && printf %s "$DATABASE_URL"`).Output()
	if err != nil || string(out) != want["DATABASE_URL"] {
		t.Fatalf("sh sourced DATABASE_URL=%q (%v), want %q", out, err, want["DATABASE_URL"])
	}
}
