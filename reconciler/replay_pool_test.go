package reconciler

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
)

// TestReplayWithAPoolOfOne: a replay holds its lock's connection for the
// whole run; with pool_max_conns=1 it must do all its work on it instead
// of waiting for a second connection.
func TestReplayWithAPoolOfOne(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.start(t)
	b.publishScenarioTrips(t, "T-one", 20, 3)
	testenv.Eventually(t, b.caughtUp, "live projection caught up")
	live := b.view(t)

	cfg := b.pool.Config().Copy()
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(one.Close)
	stats, err := Replay(t.Context(), ReplayConfig{Pool: one, JetStream: b.js, BatchSize: 16})
	require.NoError(t, err)
	require.EqualValues(t, 20, stats.Trips)
	require.Equal(t, live, b.view(t))
}
