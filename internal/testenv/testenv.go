// Package testenv gives tests the real infrastructure the system runs on: a
// private PostgreSQL cluster (started once per test binary with the
// machine's initdb/pg_ctl, or TEST_DATABASE_URL when set) and embedded NATS
// servers with JetStream. Nothing here is a mock.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/natsauth"
	"github.com/tripsaga/tripsaga/internal/natssync"
	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/pgroles"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

var (
	clusterOnce sync.Once
	cluster     *pgcluster.Cluster
	clusterURL  string
	clusterErr  error
	clusterDir  string
	dbCounter   atomic.Int64
)

// Main runs the tests and then stops the private cluster, if one was started.
func Main(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		_ = cluster.Stop()
		_ = os.RemoveAll(clusterDir)
	}
	os.Exit(code)
}

func baseURL(tb testing.TB) string {
	tb.Helper()
	clusterOnce.Do(func() {
		if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
			clusterURL = u
			return
		}
		dir, err := os.MkdirTemp("", "tripsaga-pg-")
		if err != nil {
			clusterErr = err
			return
		}
		clusterDir = dir
		// The postgres OS user (when run as root) must reach dir/pg; this
		// folder is ours, so we choose its mode (pgcluster never chmods the
		// folders above its own).
		if err := os.Chmod(dir, 0o711); err != nil {
			clusterErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cluster, clusterErr = pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(dir, "pg")})
		if clusterErr == nil {
			clusterURL = cluster.URL
		}
	})
	if clusterErr != nil {
		tb.Fatalf("testenv: private PostgreSQL: %v", clusterErr)
	}
	return clusterURL
}

// Postgres creates a fresh, empty database for the calling test and returns
// its URL. The database is dropped when the test ends.
func Postgres(tb testing.TB) string {
	tb.Helper()
	base := baseURL(tb)
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), dbCounter.Add(1))
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		tb.Fatalf("testenv: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("testenv: create database: %v", err)
	}
	tb.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	u, err := url.Parse(base)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

var (
	rolesOnce sync.Once
	rolesPW   map[string]string
	rolesErr  error
)

// Roles makes the roles of pgroles.Default in the test cluster (once per
// test binary) and hands them their schemas in the database adminURL names
// (pgroles.Bootstrap); it returns each role's URL to that database. The
// passwords are new for a private cluster; with TEST_DATABASE_URL (a
// cluster several test binaries may share) they are derived from that URL,
// so every binary sets the same ones.
func Roles(tb testing.TB, adminURL string) map[string]string {
	tb.Helper()
	base := baseURL(tb)
	roles := pgroles.Default()
	ctx := context.Background()
	rolesOnce.Do(func() {
		rolesPW = pgroles.Passwords(roles)
		if os.Getenv("TEST_DATABASE_URL") != "" {
			for r := range rolesPW {
				sum := sha256.Sum256([]byte(base + "\x00" + r))
				rolesPW[r] = hex.EncodeToString(sum[:16])
			}
		}
		rolesErr = pgroles.EnsureRoles(ctx, base, roles, rolesPW)
	})
	if rolesErr != nil {
		tb.Fatalf("testenv: roles: %v", rolesErr)
	}
	if err := pgroles.EnsureSchemas(ctx, adminURL, roles); err != nil {
		tb.Fatalf("testenv: roles: %v", err)
	}
	urls := make(map[string]string, len(roles))
	for _, r := range roles {
		u, err := pgroles.RoleURL(adminURL, r.Name, rolesPW[r.Name])
		if err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		urls[r.Name] = u
	}
	return urls
}

// NATS starts an embedded NATS server with JetStream on a random port with
// its store in a temp folder, and returns it. It is shut down and its store
// removed when the test ends.
func NATS(tb testing.TB) *server.Server {
	tb.Helper()
	s, _ := NATSWith(tb, nil)
	return s
}

// NATSWith is [NATS] with options changed by mod (e.g. a JetStreamMaxStore)
// before the server starts. It also returns the options, to change and
// pass to the server's ReloadOptions during a test.
func NATSWith(tb testing.TB, mod func(*server.Options)) (*server.Server, *server.Options) {
	tb.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  tb.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}
	// The store's sync policy of every server tripsaga runs; mod may
	// change it (a test of the default's risk).
	natssync.Apply(opts)
	if mod != nil {
		mod(opts)
	}
	// Every client connects as one of the system's identities, with its
	// permissions (internal/natsauth): see [Connect] and [Creds].
	creds := identities(tb, opts)
	s, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("testenv: nats: %v", err)
	}
	if creds != "" {
		credsDirs.Store(s, creds)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		tb.Fatalf("testenv: nats not ready")
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s, opts
}

// EventuallyBound is how long [Eventually] waits at most on a quiet
// machine.
const EventuallyBound = 60 * time.Second

// Eventually polls cond every 20 ms until it returns true or the bounded
// wait ends, then fails the test with msg. It is a wait for a condition,
// not a timed assertion: the bound only stops a hung test, so it grows on
// a busy machine (see [WaitBound]).
func Eventually(tb testing.TB, cond func() bool, msg string, args ...any) {
	tb.Helper()
	deadline := time.Now().Add(WaitBound(EventuallyBound))
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatalf("testenv: condition never held: "+msg, args...)
}

// WaitBound returns d stretched by how busy the machine is now: by the
// 1-minute load average per CPU (/proc/loadavg, runtime.NumCPU) over 4,
// between 1 and 5 times d. The same work takes longer while other jobs
// take the CPUs; a bound meant only to stop a hung test must not fail one
// that is merely slow.
func WaitBound(d time.Duration) time.Duration {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return d
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return d
	}
	load, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return d
	}
	scale := min(max(load/float64(runtime.NumCPU())/4, 1), 5)
	return time.Duration(float64(d) * scale)
}

// SchemaPool creates a fresh database (see [Postgres]), applies the
// migration sets to schema and returns a pool whose search_path is schema,
// as a service's own pool is, together with the database URL (the
// administrator's). When a role of pgroles.Default owns schema, the
// migrations and the pool run as that role ([Roles]). The pool is closed
// when the test ends.
func SchemaPool(tb testing.TB, schema string, sets ...string) (*pgxpool.Pool, string) {
	tb.Helper()
	ctx := context.Background()
	url := Postgres(tb)
	// A schema of a service is migrated and reached as its own role
	// (internal/pgroles), as the service does.
	roleURL := url
	if r, ok := pgroles.ForSchema(pgroles.Default(), schema); ok {
		roleURL = Roles(tb, url)[r.Name]
	}
	if err := tripsql.Migrate(ctx, roleURL, schema, sets...); err != nil {
		tb.Fatalf("testenv: migrate: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(roleURL)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("testenv: pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool, url
}

// JetStream starts an embedded server (see [NATS]), connects to it as
// natsauth.Admin (a test plays several services) and creates the event
// streams of the default catalogue.
func JetStream(tb testing.TB) (*server.Server, *nats.Conn, jetstream.JetStream) {
	tb.Helper()
	srv := NATS(tb)
	nc := Connect(tb, srv, natsauth.Admin)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("testenv: jetstream: %v", err)
	}
	if err := events.EnsureStreams(context.Background(), js, events.Selected()); err != nil {
		tb.Fatalf("testenv: streams: %v", err)
	}
	return srv, nc, js
}

// RequirePGAutoctlEnv names the environment variable that turns a
// missing pg_autoctl (pg_auto_failover) from a skip into a failure
// ([PGAutoctl]); .ci/run sets it.
const RequirePGAutoctlEnv = "TRIPSAGA_REQUIRE_PG_AUTOCTL"

// PGAutoctl skips the calling test, loudly, when pg_autoctl is not on
// PATH (the PostgreSQL failover tests need a pg_auto_failover pair), or
// fails it when $TRIPSAGA_REQUIRE_PG_AUTOCTL is set (CI installs it: there
// a failover test must run).
func PGAutoctl(tb testing.TB) {
	tb.Helper()
	if _, err := exec.LookPath("pg_autoctl"); err == nil {
		return
	}
	msg := "pg_auto_failover is not installed (no pg_autoctl on PATH): this PostgreSQL failover test cannot run; apt-get install postgresql-15-auto-failover"
	if os.Getenv(RequirePGAutoctlEnv) != "" {
		tb.Fatal(msg + " ($" + RequirePGAutoctlEnv + " is set)")
	}
	tb.Log("SKIPPED (NOT RUN): " + msg)
	tb.Skip(msg)
}

// RequireFaketimeEnv names the environment variable that turns a missing
// libfaketime from a skip into a failure ([Faketime]); .ci/run sets it.
const RequireFaketimeEnv = "TRIPSAGA_REQUIRE_FAKETIME"

// Faketime skips the calling test, loudly, when libfaketime is not
// installed (so pgcluster.Config.ClockOffset cannot be honoured), or fails
// it when $TRIPSAGA_REQUIRE_FAKETIME is set (CI installs it: there a clock
// test must run).
func Faketime(tb testing.TB) {
	tb.Helper()
	if pgcluster.HasFaketime() {
		return
	}
	msg := "libfaketime is not installed (" + pgcluster.FaketimeLibrary + "): this test of a database clock that disagrees with the services' cannot run; apt-get install faketime"
	if os.Getenv(RequireFaketimeEnv) != "" {
		tb.Fatal(msg + " ($" + RequireFaketimeEnv + " is set)")
	}
	tb.Log("SKIPPED (NOT RUN): " + msg)
	tb.Skip(msg)
}
