package process

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// TestPoolConnectsArePacedWhilePostgresResets: while every connection to
// PostgreSQL is reset (a firewall that rejects, a server restarting), a
// service's pool asked for connections in a tight loop begins at most its
// burst (MaxConns) plus PGConnectRate a second, instead of one per ask
// (what reached the server is logged: pgx may dial more than once for
// one, e.g. with TLS and then without); healed, it connects again.
func TestPoolConnectsArePacedWhilePostgresResets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := url.Parse(testenv.Postgres(t))
	require.NoError(t, err)
	var accepts atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	real := u.Host
	var healed atomic.Bool
	go func() { // a proxy that resets every connection until healed
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			if !healed.Load() {
				_ = c.(*net.TCPConn).SetLinger(0)
				_ = c.Close()
				continue
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", real)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	u.Host = ln.Addr().String()
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	cfg.MaxConns = 8
	netSettings(cfg)
	var befores atomic.Int64 // connections the pacing let begin
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error { befores.Add(1); return nil }
	connectPacing(cfg)
	made := time.Now() // the pacing's burst is full from here
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	start := time.Now()
	asks := 0
	for time.Since(start) < 2*time.Second {
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				_, err := pool.Exec(actx, "SELECT 1")
				require.Error(t, err, "every connection is reset")
			}()
		}
		wg.Wait()
		asks += 20
	}
	// Connections the pool began for an ask whose deadline passed go on
	// in the background: the count is read with the time it is read at.
	tried, elapsed := befores.Load(), time.Since(made)
	bound := int64(cfg.MaxConns) + int64(PGConnectRate*elapsed.Seconds()) + 1
	t.Logf("%d asks in %s: %d connections begun (bound %d), %d reached the server", asks, elapsed.Round(time.Millisecond), tried, bound, accepts.Load())
	require.LessOrEqual(t, tried, bound, "connections paced")
	require.Greater(t, int64(asks), bound, "asked more often than the pacing lets through")

	healed.Store(true)
	testenv.Eventually(t, func() bool { return pool.Ping(ctx) == nil }, "healed, the pool connects again")
}
