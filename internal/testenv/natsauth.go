package testenv

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/natsauth"
)

// credsDirs maps each embedded server started by [NATSWith] to the folder
// of its identities' seed files.
var credsDirs sync.Map //nolint:gochecknoglobals // one per test binary; *server.Server -> string

// identities makes opts require the NATS identities (natsauth)
// of the test's catalogue (STEPS; the default one when unset), unless the
// test configured authentication itself, and returns the folder of their
// seeds ("" when it did not).
func identities(tb testing.TB, opts *server.Options) string {
	tb.Helper()
	if opts.Nkeys != nil || opts.Users != nil || opts.Username != "" || opts.Authorization != "" {
		return ""
	}
	dir := filepath.Join(tb.TempDir(), "auth")
	c, err := events.FromEnv() // the test's STEPS, as its processes read it
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	ids := natsauth.Identities(c)
	pubs, err := natsauth.Provision(dir, ids)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	if err := natsauth.Configure(opts, ids, pubs); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return dir
}

// Creds returns the seed file (NATS_CREDS) of identity name (a service
// or natsauth.Admin) on srv, a server started by [NATS] or [NATSWith].
func Creds(tb testing.TB, srv *server.Server, name string) string {
	tb.Helper()
	dir, ok := credsDirs.Load(srv)
	if !ok {
		tb.Fatalf("testenv: the server %s was not started by testenv with identities", srv.ClientURL())
	}
	return natsauth.CredsFile(dir.(string), name)
}

// Client returns how identity name connects to srv (its NATS_CREDS), to
// put in an process.Env.
func Client(tb testing.TB, srv *server.Server, name string) natsauth.Client {
	tb.Helper()
	return natsauth.Client{Creds: Creds(tb, srv, name)}
}

// Connect connects to srv as identity name, with its inbox prefix and
// the options given; the connection is closed when the test ends.
func Connect(tb testing.TB, srv *server.Server, name string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	aopts, err := Client(tb, srv, name).Options(name)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	nc, err := nats.Connect(srv.ClientURL(), append(opts, aopts...)...)
	if err != nil {
		tb.Fatalf("testenv: nats connect as %s: %v", name, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}
