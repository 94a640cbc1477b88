package saga

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// TestAnUnlockThatAnswersFalseIsAnError: when the session Close unlocks
// on no longer holds the process's lock (as behind a pooler in
// transaction mode, where the lock was taken on another backend), Close
// says so at error level instead of ignoring the unlock's answer; a
// normal stop logs no error.
func TestAnUnlockThatAnswersFalseIsAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.SchemaPool(t, "hotel", tripsql.SetSaga)
	start := func(instance string) (*Liveness, *bytes.Buffer) {
		var log bytes.Buffer
		l := NewLiveness(pool, "hotel", instance, slog.New(slog.NewTextHandler(&log, nil)))
		require.NoError(t, l.Start(ctx))
		return l, &log
	}
	ok, okLog := start("hotel-ok")
	ok.Close()
	require.NotContains(t, okLog.String(), "level=ERROR")

	lost, lostLog := start("hotel-lost")
	// The lock goes away under the process's session.
	unlocked, err := queries.ProcessUnlock(ctx, lost.conn, dbsqlc.ProcessUnlockParams{Namespace: int32(lost.ns.Load()), ID: lost.ID()})
	require.NoError(t, err)
	require.True(t, unlocked)
	lost.Close()
	require.Contains(t, lostLog.String(), "level=ERROR")
	require.Contains(t, lostLog.String(), "unlock answered false")
}
