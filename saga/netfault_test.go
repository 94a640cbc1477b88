package saga_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/netfault"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/services/hotel"
	"github.com/tripsaga/tripsaga/sim"
)

// cutTiming: a call timeout long enough that a call is still in flight
// when the network is broken under it and past the old rule's 3 s of
// silence (under which a peer called while it was), and a deadline far
// enough that the step is never undone meanwhile.
var cutTiming = saga.Timing{
	CallTimeout: 6 * time.Second, StepDeadline: time.Minute,
	RetryBackoffMin: 20 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond,
	UndoBackoffMin: 20 * time.Millisecond, UndoBackoffMax: 100 * time.Millisecond,
	IncidentAfter: 3, VerifyAfter: time.Minute, PollInterval: 20 * time.Millisecond,
}

// replica is a process of the hotel service: its liveness and its runner,
// both running.
type replica struct {
	live   *saga.Liveness
	runner *saga.Runner
}

// runReplica starts a replica named instance on pool and stops it at the
// test's end (before the pool closes).
func runReplica(t *testing.T, b *bundle, pool *pgxpool.Pool, instance string, before func()) replica {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("replica", instance)
	live := saga.NewLiveness(pool, "hotel", instance, log)
	require.NoError(t, live.Start(context.Background()))
	r, err := saga.New(saga.Config{Pool: pool, Spec: hotel.Spec(b.hotelURL), Timing: cutTiming, Liveness: live, Logger: log})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = live.Run(ctx) }()
	go func() { defer wg.Done(); _ = r.Run(ctx) }()
	t.Cleanup(func() {
		if before != nil {
			before()
		}
		cancel()
		wg.Wait()
		live.Close()
	})
	return replica{live: live, runner: r}
}

// testWriter writes a replica's log to the test's, shown when it fails.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// behindProxy returns a pool of b's schema that reaches PostgreSQL through
// a netfault proxy, and the proxy. Dials through it give up after 2 s.
func behindProxy(t *testing.T, b *bundle) (*pgxpool.Pool, *netfault.Proxy) {
	t.Helper()
	cfg := b.pool.Config()
	upstream := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	p, err := netfault.Start("postgres-a", upstream)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = p.Host(), p.Port(), nil
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close(); pool.Close() })
	return pool, p
}

func hotelStats(t *testing.T, b *bundle) sim.Stats {
	t.Helper()
	st, err := sim.GetStats(context.Background(), b.hotelURL)
	require.NoError(t, err)
	return st
}

// TestNetworkFaultsOfAReplica: replica A reaches PostgreSQL through a real
// TCP proxy (internal/netfault), its peer B directly; both reach the hotel
// simulator over real HTTP. A claims a hold and calls the hotel, which
// commits and answers slowly, and the network between A and PostgreSQL
// breaks while the call is in flight. A's lease is long (as with a long
// CALL_TIMEOUT_MS), so only the liveness rule can move it.
//
// Cut (blackhole, reset, half-closed): A is fenced once no beat has
// committed for FenceAfter, makes no further write to the company, and
// B takes the row after TakeoverAfter from A's last beat (on the
// database's clock), never before, and within two beats of it; B learns
// the hold by the same key. Slowed: A beats on, keeps its lease and
// records the answer itself; B takes nothing. Always: never two writes of
// the key in flight at once (the simulator's count), one hold, the step
// done; healed, A beats again and calls nothing more.
func TestNetworkFaultsOfAReplica(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		fault func(*netfault.Proxy) error
		cut   bool
	}{
		{"blackholed, no reset", (*netfault.Proxy).Blackhole, true},
		{"cut with a reset", (*netfault.Proxy).Reset, true},
		{"closed half-way through an answer", func(p *netfault.Proxy) error { return p.HalfClose(7) }, true},
		{"slowed by 100 ms each way", func(p *netfault.Proxy) error { return p.Latency(100*time.Millisecond, 0) }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			poolA, proxy := behindProxy(t, b)
			if tc.cut {
				require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultSlowAnswer, DelayMS: 60_000, Times: 1}))
			} else {
				require.NoError(t, tc.fault(proxy))
			}
			a := runReplica(t, b, poolA, "hotel-a", func() { _ = proxy.Heal() })
			request(t, b, a.runner, "T-1", "one@x.io")
			testenv.Eventually(t, func() bool { return hotelStats(t, b).Writes == 1 }, "A's call reached the hotel")

			if !tc.cut {
				testenv.Eventually(t, func() bool { return step(t, b, "T-1").Status == "done" }, "A records the answer through the slow network")
				peer := runReplica(t, b, b.pool, "hotel-b", nil)
				_, err := peer.runner.RecoveryPass(ctx)
				require.NoError(t, err)
				require.False(t, a.live.Fenced(), "a slow replica still beats")
				st := hotelStats(t, b)
				require.Equal(t, int64(1), st.Writes, "one call, by A")
				require.Zero(t, st.OverlappingCalls)
				return
			}

			// A's call is in flight; its lease is long.
			tag, err := b.pool.Exec(ctx, "UPDATE steps SET next_attempt_at = now() + interval '1 hour' WHERE trip_id = 'T-1' AND status = 'started' AND owner = $1", a.live.ID())
			require.NoError(t, err)
			require.Equal(t, int64(1), tag.RowsAffected(), "A's call is still in flight")
			require.NoError(t, tc.fault(proxy))
			peer := runReplica(t, b, b.pool, "hotel-b", nil)
			testenv.Eventually(t, func() bool { return step(t, b, "T-1").Status == "done" }, "the peer takes A's lease and finishes the step")

			require.True(t, a.live.Fenced(), "A, cut off, is fenced")
			st := hotelStats(t, b)
			require.Zero(t, st.OverlappingCalls, "never two calls of one key in flight at once")
			require.Equal(t, int64(1), st.MaxInFlightPerKey)
			require.Equal(t, int64(2), st.Writes, "A's call, then the peer's by the same key")
			holds, err := b.company.List(ctx, "")
			require.NoError(t, err)
			require.Len(t, holds, 1, "held once")
			s := step(t, b, "T-1")
			require.Equal(t, 2, s.Attempts)
			// The peer's answer came after A's last beat + the takeover
			// grace (both on this machine's clock), and within two beats
			// more (one release pass, one claim), with room for a loaded
			// machine.
			var ms float64
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT extract(epoch FROM s.finished_at - p.seen_at)::float8 * 1000 FROM steps s, processes p WHERE s.trip_id = 'T-1' AND p.id = $1", a.live.ID()).Scan(&ms))
			silent := time.Duration(ms * float64(time.Millisecond))
			grace := peer.live.TakeoverAfter()
			require.Equal(t, saga.FenceAfter+cutTiming.CallTimeout+saga.TakeoverMargin, grace)
			t.Logf("%s: the peer finished the step %s after A's last beat (takeover grace %s)", tc.name, silent, grace)
			require.GreaterOrEqual(t, silent, grace, "never before the grace")
			require.Less(t, silent, grace+2*saga.BeatInterval+10*time.Second, "within the documented bound (+10 s for a loaded machine)")

			// Healed, A beats again, and calls nothing more.
			require.NoError(t, proxy.Heal())
			testenv.Eventually(t, func() bool { return !a.live.Fenced() }, "A beats again once healed")
			_, err = a.runner.RecoveryPass(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(2), hotelStats(t, b).Writes, "A made no further call")
			require.Equal(t, "done", step(t, b, "T-1").Status)
		})
	}
}

// TestASilentReplicasLockIsFreedByTheServer: a replica blackholed between
// it and PostgreSQL (no reset: its session's socket stays open, and TCP
// would notice only after the OS's two-hour keepalive) that does nothing
// more, frozen, loses its advisory lock within LockIdleTimeout: the
// server ends the idle session itself (idle_session_timeout), so a peer
// can find the replica dead.
func TestASilentReplicasLockIsFreedByTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	poolA, proxy := behindProxy(t, b)
	live := saga.NewLiveness(poolA, "hotel", "hotel-frozen", nil)
	started := time.Now() // the lock's last statement runs after this
	require.NoError(t, live.Start(ctx))
	held := func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND objid::bigint = $1
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, live.ID()).Scan(&n))
		return n > 0
	}
	require.True(t, held())
	require.NoError(t, proxy.Blackhole())
	testenv.Eventually(t, func() bool { return !held() }, "the server ends the silent session and frees its lock")
	t.Logf("lock freed %s after its session's last statement (idle_session_timeout %s)", time.Since(started), saga.LockIdleTimeout)
	require.GreaterOrEqual(t, time.Since(started), saga.LockIdleTimeout-100*time.Millisecond, "freed by the idle timeout, not by a close")
	require.True(t, live.Fenced(), "no beat: fenced")
	require.NoError(t, proxy.Heal())
	live.Close() // the unlock fails (session gone): logged, not fatal
}
