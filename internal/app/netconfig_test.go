package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/netfault"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

// TestPostgresSessionsRunWithTheNetworkTimeouts: every session of a
// service's pool runs with the server-side keepalives, user timeout and
// statement and idle-in-transaction timeouts of netconfig.go (SHOW reads
// them from the server), a value DATABASE_URL gives is kept, and the
// client dials with a connect timeout.
func TestPostgresSessionsRunWithTheNetworkTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.Postgres(t) + "&options=-c%20statement_timeout%3D12345")
	require.NoError(t, err)
	netSettings(cfg)
	require.Equal(t, PGConnectTimeout, cfg.ConnConfig.ConnectTimeout)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for name, want := range map[string]string{
		"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "1", "tcp_keepalives_count": "3", // seconds
		"tcp_user_timeout": "8000", "idle_in_transaction_session_timeout": "30s", // ms, shown as such
		"statement_timeout": "12345ms", // the URL's
	} {
		var got string
		require.NoError(t, pool.QueryRow(ctx, "SHOW "+name).Scan(&got))
		require.Equal(t, want, got, name)
	}
}

// TestNATSNoticesASilentServer: a NATS connection blackholed (no reset,
// so TCP says nothing) is taken as stale by its pings and reported
// disconnected, at most NATSPingInterval × (NATSMaxPingsOut + 1) after
// the server fell silent, instead of nats.go's default of minutes.
func TestNATSNoticesASilentServer(t *testing.T) {
	t.Parallel()
	srv := testenv.NATS(t)
	p, err := netfault.Start("nats", srv.Addr().String())
	require.NoError(t, err)
	t.Cleanup(p.Close)
	env := Env{NATSURL: "nats://" + p.Addr(), NATSClient: testenv.Client(t, srv, "hotel")}
	lost := make(chan error, 1)
	nc, err := ConnectNATS(env, "hotel", append(natsNetOptions(), nats.IgnoreDiscoveredServers(), nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			select {
			case lost <- err:
			default:
			}
		}))...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	require.NoError(t, nc.Flush(), "the connection carries before the fault")
	require.NoError(t, p.Blackhole())
	start := time.Now()
	select {
	case err := <-lost:
		t.Logf("disconnect noticed %s after the blackhole: %v", time.Since(start), err)
		require.True(t, errors.Is(err, nats.ErrStaleConnection), "noticed by its pings: %v", err)
	case <-time.After(time.Minute): // only stops a hung test
		t.Fatal("a blackholed NATS connection was never noticed")
	}
}
