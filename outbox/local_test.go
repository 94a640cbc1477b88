package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
)

func TestLocalPublishAfterCommit(t *testing.T) {
	t.Parallel()

	t.Run("TheWritersRelayPublishesRightAfterCommitAndMarks", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Claims would take rows only after an hour: what gets published
		// here went by the local path.
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, PollInterval: time.Hour, LocalGrace: 50 * time.Second})
		require.NoError(t, err)
		go func() { _ = r.Run(ctx) }()
		testenv.Eventually(t, r.running.Load, "relay running")

		e1, e2 := newEvent(t, "T-l1"), newEvent(t, "T-l2")
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		wctx, committed := WithAfterCommit(ctx, r)
		require.NoError(t, Write(wctx, tx, e1, e2))
		require.Empty(t, streamIDs(t, b), "nothing is published before the commit")
		require.NoError(t, tx.Commit(ctx))
		committed()
		testenv.Eventually(t, func() bool {
			return rowOf(t, b, e1.ID()).published && rowOf(t, b, e2.ID()).published
		}, "published and marked")
		require.ElementsMatch(t, []string{e1.ID(), e2.ID()}, streamIDs(t, b))
	})

	t.Run("AnEventWhoseProcessDiedBeforePublishingIsClaimedAfterTheGrace", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, PollInterval: 20 * time.Millisecond, LocalGrace: 300 * time.Millisecond})
		require.NoError(t, err)
		go func() { _ = r.Run(ctx) }()
		testenv.Eventually(t, r.running.Load, "relay running")

		e := newEvent(t, "T-died")
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		wctx, _ := WithAfterCommit(ctx, r) // the process dies after COMMIT: committed() never runs
		require.NoError(t, Write(wctx, tx, e))
		require.NoError(t, tx.Commit(ctx))
		var waits bool
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT next_attempt_at > now() FROM outbox WHERE event_id = $1", e.ID()).Scan(&waits))
		require.True(t, waits, "the row is left to its writer for the grace")
		testenv.Eventually(t, func() bool { return rowOf(t, b, e.ID()).published }, "claimed and published after the grace")
		require.Equal(t, []string{e.ID()}, streamIDs(t, b))
	})

	t.Run("WithoutARunningRelayWriteNotifiesAsBefore", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js})
		require.NoError(t, err)
		ctx := context.Background()
		e := newEvent(t, "T-norelay")
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		wctx, committed := WithAfterCommit(ctx, r) // r is not running
		require.NoError(t, Write(wctx, tx, e))
		require.NoError(t, tx.Commit(ctx))
		committed()
		drain(t, r) // due at once: claimed by the first batch
		require.Equal(t, []string{e.ID()}, streamIDs(t, b))
	})
}
