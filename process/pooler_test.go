package process

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/saga"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// TestATransactionPoolerIsRefusedAtStart: behind a real PgBouncer in
// transaction or statement mode a process refuses to start, naming the
// pool mode and what to set, before it migrates or takes a lock; the
// documented URL is not refused for its search_path (which is set after
// connecting) even without ignore_startup_parameters.
func TestATransactionPoolerIsRefusedAtStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := testenv.Postgres(t)
	hotelURL := testenv.Roles(t, admin)["hotel"]
	for _, mode := range []string{"transaction", "statement"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			via := testenv.PgBouncer(t, admin, mode, []string{hotelURL})
			_, err := Open(ctx, "hotel", "hotel", Env{DatabaseURL: via(hotelURL)}, false, tripsql.SetSaga)
			require.ErrorIs(t, err, ErrTransactionPooler)
			require.ErrorContains(t, err, "refusing to start")
			require.ErrorContains(t, err, "pool_mode = session")
			require.NotContains(t, err.Error(), "unsupported startup parameter")
			// Nothing was migrated through the pooler.
			conn, err := pgx.Connect(ctx, admin)
			require.NoError(t, err)
			defer conn.Close(ctx)
			var tables int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'hotel'").Scan(&tables))
			require.Zero(t, tables)
		})
	}
}

// TestASessionPoolerWorks: behind a real PgBouncer in session mode a
// process starts (session check, migrations, pool), two replicas'
// liveness locks are held by two server backends, a replica whose client
// session ends without unlocking (as under SIGKILL) has its lock freed by
// the pooler's reset, and a stopping replica's unlock answers true.
func TestASessionPoolerWorks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := testenv.Postgres(t)
	hotelURL := testenv.Roles(t, admin)["hotel"]
	require.NoError(t, CheckSession(ctx, hotelURL), "PostgreSQL itself passes the check")
	via := testenv.PgBouncer(t, admin, "session", []string{hotelURL})
	open := func() *Process {
		p, err := Open(ctx, "hotel", "hotel", Env{DatabaseURL: via(hotelURL)}, false, tripsql.SetSaga)
		require.NoError(t, err)
		return p
	}
	b := open()
	defer b.Close()
	// Replica a's pool records its sockets, to close them as a kill does.
	var mu sync.Mutex
	var sockets []net.Conn
	cfg, err := pgxpool.ParseConfig(via(hotelURL))
	require.NoError(t, err)
	cfg.AfterConnect = tripsql.SetSearchPath("hotel")
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			mu.Lock()
			sockets = append(sockets, c)
			mu.Unlock()
		}
		return c, err
	}
	aPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	la := saga.NewLiveness(aPool, "hotel", "hotel-a", nil)
	var logB bytes.Buffer
	lb := saga.NewLiveness(b.Pool, "hotel", "hotel-b", slog.New(slog.NewTextHandler(&logB, nil)))
	require.NoError(t, la.Start(ctx))
	require.NoError(t, lb.Start(ctx))
	live, err := lb.Live(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []int32{la.ID(), lb.ID()}, live)

	direct, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer direct.Close(ctx)
	var backends int
	require.NoError(t, direct.QueryRow(ctx, `SELECT count(DISTINCT pid) FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND objid::bigint::int = ANY($1)`, []int32{la.ID(), lb.ID()}).Scan(&backends))
	require.Equal(t, 2, backends, "each replica's lock is held by its own backend")

	// Replica a's sockets to the pooler close without an unlock, as when
	// its process is killed: the pooler resets the server session
	// (server_reset_query, DISCARD ALL), which lets go of the lock.
	mu.Lock()
	for _, c := range sockets {
		_ = c.Close()
	}
	mu.Unlock()
	testenv.Eventually(t, func() bool {
		live, err := lb.Live(ctx)
		return err == nil && !slices.Contains(live, la.ID()) && slices.Contains(live, lb.ID())
	}, "the lock of the replica whose session ended is freed, the other's kept")

	lb.Close()
	require.NotContains(t, logB.String(), "level=ERROR", "the stopping replica's unlock answered true")
	live, err = lb.Live(ctx)
	require.NoError(t, err)
	require.NotContains(t, live, lb.ID(), "a stopped replica's lock is released")
}
