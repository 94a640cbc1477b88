// Package sagatest gives the tests of a saga built on this module the
// real infrastructure it runs on, from any Go module: a private
// PostgreSQL cluster (started once per test binary with the machine's
// initdb and pg_ctl, run as the postgres OS user when the test runs as
// root; or TEST_DATABASE_URL when set), a fresh database per test, the
// machinery's tables (outbox, inbox, saga steps) migrated into a schema
// of the saga's, and embedded NATS servers with JetStream and the
// streams of the saga's catalogue. Nothing here is a mock.
//
// Use it from TestMain, so the cluster is stopped when the tests end:
//
//	func TestMain(m *testing.M) { sagatest.Main(m) }
//
// and in a test:
//
//	pool := sagatest.Pool(t, "shop", sagatest.MachinerySet) // outbox, inbox, steps in schema shop
//	_, _, js := sagatest.JetStream(t, cat)  // cat's streams, on an embedded server
//
// Waiting is on conditions, never on sleeps ([Eventually]); its bound
// stretches on a busy machine ([WaitBound]).
package sagatest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
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
	"github.com/tripsaga/tripsaga/internal/natssync"
	"github.com/tripsaga/tripsaga/internal/pgcluster"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// DatabaseURLEnv names the environment variable of a PostgreSQL server
// to use instead of a private cluster (an administrator's URL: each test
// creates its database there).
const DatabaseURLEnv = "TEST_DATABASE_URL"

var (
	clusterOnce sync.Once          //nolint:gochecknoglobals // the test binary's one cluster
	cluster     *pgcluster.Cluster //nolint:gochecknoglobals // the test binary's one cluster
	clusterURL  string             //nolint:gochecknoglobals // the test binary's one cluster
	clusterErr  error              //nolint:gochecknoglobals // the test binary's one cluster
	clusterDir  string             //nolint:gochecknoglobals // the test binary's one cluster
	dbCounter   atomic.Int64       //nolint:gochecknoglobals // the test binary's one cluster
)

// Main runs the tests and then stops the private cluster, if one was
// started, and exits with the tests' code.
func Main(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		_ = cluster.Stop()
		_ = os.RemoveAll(clusterDir)
	}
	os.Exit(code)
}

// AdminURL returns the URL of the test binary's PostgreSQL as its
// superuser: $TEST_DATABASE_URL, or a private cluster started on the
// first call (in a temp folder, on a free port, fsync on). It fails tb
// when the cluster cannot start (no initdb on PATH, for one).
func AdminURL(tb testing.TB) string {
	tb.Helper()
	clusterOnce.Do(func() {
		if u := os.Getenv(DatabaseURLEnv); u != "" {
			clusterURL = u
			return
		}
		sweepLeftBehind(os.TempDir())
		dir, err := os.MkdirTemp("", clusterDirPrefix)
		if err != nil {
			clusterErr = err
			return
		}
		clusterDir = dir
		// Who owns the cluster: a later test binary stops it and removes
		// the folder once this process is gone (killed before Main could).
		if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			clusterErr = err
			return
		}
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
		tb.Fatalf("sagatest: private PostgreSQL: %v", clusterErr)
	}
	return clusterURL
}

// clusterDirPrefix starts the name of each test binary's cluster folder
// in os.TempDir(), and ownerFile, in it, holds the binary's pid.
const (
	clusterDirPrefix = "tripsaga-pg-"
	ownerFile        = "owner.pid"
)

// sweepLeftBehind stops the server of, and removes, every cluster folder
// in base whose owner (ownerFile) is no longer running: what a test
// binary killed before [Main] stopped its cluster left behind (issue 19:
// killed test runs left private clusters running). A folder without an
// owner file, or whose owner runs, is left alone.
func sweepLeftBehind(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, clusterDirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours (pgcluster's temp homes), or being made
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() || pgcluster.ProcessAlive(pid) {
			continue
		}
		if _, err := pgcluster.StopLeftBehind(filepath.Join(dir, "pg")); err != nil {
			continue // try again next time rather than remove a running server's files
		}
		_ = os.RemoveAll(dir)
	}
}

// Postgres creates a fresh, empty database for the calling test and
// returns its URL (as the superuser). The database is dropped when the
// test ends.
func Postgres(tb testing.TB) string {
	tb.Helper()
	base := AdminURL(tb)
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), dbCounter.Add(1))
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		tb.Fatalf("sagatest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("sagatest: create database: %v", err)
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
		tb.Fatalf("sagatest: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// MachinerySet is the migration set of the machinery's own tables: the
// outbox, the inbox, the saga steps and their leases and incidents
// (sql/migrations/saga). A step service's schema needs it.
const MachinerySet = "saga"

// Pool creates a fresh database ([Postgres]), applies the migration sets
// ([MachinerySet] for a step service; none only creates schema) to
// schema, and returns a pool whose
// search_path is schema, as a step service's own pool is. The pool is
// closed when the test ends. Use [PoolAt] to migrate and connect with
// another URL (a role of the saga's own).
func Pool(tb testing.TB, schema string, sets ...string) *pgxpool.Pool {
	tb.Helper()
	return PoolAt(tb, Postgres(tb), schema, sets...)
}

// PoolAt is [Pool] on the database databaseURL names, migrated and
// reached with that URL.
func PoolAt(tb testing.TB, databaseURL, schema string, sets ...string) *pgxpool.Pool {
	tb.Helper()
	ctx := context.Background()
	if err := tripsql.Migrate(ctx, databaseURL, schema, sets...); err != nil {
		tb.Fatalf("sagatest: migrate: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		tb.Fatalf("sagatest: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("sagatest: pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// NATS starts an embedded NATS server with JetStream on a random port of
// 127.0.0.1, its store in a temp folder, and returns it with its
// options. mod, when not nil, changes the options before the server
// starts (limits, authentication). Every store is synced as the
// system's servers sync theirs (each write, not every 2 minutes: nats-server's
// sync_interval, see internal/natssync). It is shut down and its store
// removed when the test ends.
func NATS(tb testing.TB, mod func(*server.Options)) (*server.Server, *server.Options) {
	tb.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  tb.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}
	natssync.Apply(opts)
	if mod != nil {
		mod(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("sagatest: nats: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		tb.Fatalf("sagatest: nats not ready")
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s, opts
}

// JetStream starts an embedded server without authentication ([NATS]),
// connects to it and creates the streams of catalogue c (one replica).
// The connection is closed when the test ends.
func JetStream(tb testing.TB, c events.Catalogue) (*server.Server, *nats.Conn, jetstream.JetStream) {
	tb.Helper()
	srv, _ := NATS(tb, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		tb.Fatalf("sagatest: nats connect: %v", err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("sagatest: jetstream: %v", err)
	}
	if err := events.EnsureStreams(context.Background(), js, c); err != nil {
		tb.Fatalf("sagatest: streams: %v", err)
	}
	return srv, nc, js
}

// JSON is v encoded as JSON (a saga's request, as its events carry it),
// failing tb when it cannot be.
func JSON(tb testing.TB, v any) json.RawMessage {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatalf("sagatest: json: %v", err)
	}
	return b
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
	tb.Fatalf("sagatest: condition never held: "+msg, args...)
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
