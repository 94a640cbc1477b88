// Package testenv gives the trip's tests the real infrastructure the
// system runs on: the public test kit (package sagatest: a private
// PostgreSQL cluster, a database per test, embedded NATS servers with
// JetStream) with the trip's own on top: its PostgreSQL roles
// (internal/pgroles), its NATS identities (natsauth) and its
// streams. Nothing here is a mock.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/pgroles"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/sagatest"
)

// Main runs the tests and then stops the private cluster, if one was
// started ([sagatest.Main]).
func Main(m *testing.M) { sagatest.Main(m) }

func baseURL(tb testing.TB) string {
	tb.Helper()
	return sagatest.AdminURL(tb)
}

// Postgres creates a fresh, empty database for the calling test and returns
// its URL ([sagatest.Postgres]). The database is dropped when the test ends.
func Postgres(tb testing.TB) string {
	tb.Helper()
	return sagatest.Postgres(tb)
}

var (
	rolesOnce sync.Once         //nolint:gochecknoglobals // once per test binary
	rolesPW   map[string]string //nolint:gochecknoglobals // once per test binary
	rolesErr  error             //nolint:gochecknoglobals // once per test binary
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
// before the server starts ([sagatest.NATS]), and the system's identities
// required (natsauth; see [Connect] and [Creds]) unless mod
// configured authentication itself. It also returns the options, to
// change and pass to the server's ReloadOptions during a test.
func NATSWith(tb testing.TB, mod func(*server.Options)) (*server.Server, *server.Options) {
	tb.Helper()
	var creds string
	s, opts := sagatest.NATS(tb, func(opts *server.Options) {
		if mod != nil {
			mod(opts)
		}
		creds = identities(tb, opts)
	})
	if creds != "" {
		credsDirs.Store(s, creds)
	}
	return s, opts
}

// EventuallyBound is how long [Eventually] waits at most on a quiet
// machine.
const EventuallyBound = sagatest.EventuallyBound

// Eventually polls cond until it returns true or the bounded wait ends,
// then fails the test with msg ([sagatest.Eventually]).
func Eventually(tb testing.TB, cond func() bool, msg string, args ...any) {
	tb.Helper()
	sagatest.Eventually(tb, cond, msg, args...)
}

// WaitBound returns d stretched by how busy the machine is now
// ([sagatest.WaitBound]).
func WaitBound(d time.Duration) time.Duration { return sagatest.WaitBound(d) }

// SchemaPool creates a fresh database (see [Postgres]), applies the
// migration sets to schema and returns a pool whose search_path is schema,
// as a service's own pool is, together with the database URL (the
// administrator's). When a role of pgroles.Default owns schema, the
// migrations and the pool run as that role ([Roles]). The pool is closed
// when the test ends.
func SchemaPool(tb testing.TB, schema string, sets ...string) (*pgxpool.Pool, string) {
	tb.Helper()
	url := Postgres(tb)
	// A schema of a service is migrated and reached as its own role
	// (internal/pgroles), as the service does.
	roleURL := url
	if r, ok := pgroles.ForSchema(pgroles.Default(), schema); ok {
		roleURL = Roles(tb, url)[r.Name]
	}
	return sagatest.PoolAt(tb, roleURL, schema, sets...), url
}

// JetStream starts an embedded server (see [NATS]), connects to it as
// natsauth.Admin (a test plays several services) and creates the event
// streams of the test's catalogue (STEPS; the default one when unset).
func JetStream(tb testing.TB) (*server.Server, *nats.Conn, jetstream.JetStream) {
	tb.Helper()
	srv := NATS(tb)
	nc := Connect(tb, srv, natsauth.Admin)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("testenv: jetstream: %v", err)
	}
	c, err := events.FromEnv()
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	if err := events.EnsureStreams(context.Background(), js, c); err != nil {
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
