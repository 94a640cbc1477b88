package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

// TestUnitOfWork runs the calls of ExampleUnitOfWork_InTx and
// ExampleRelay_Write against a real PostgreSQL and JetStream.
func TestUnitOfWork(t *testing.T) {
	t.Parallel()
	withTable := func(t *testing.T) *bundle {
		b := setup(t)
		_, err := b.pool.Exec(context.Background(), `CREATE TABLE things (id text PRIMARY KEY)`)
		require.NoError(t, err)
		return b
	}
	count := func(t *testing.T, b *bundle, query string) int {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(), query).Scan(&n))
		return n
	}

	t.Run("TheChangeAndItsEventCommitTogetherAndTheRunningRelayPublishesAfterCommit", func(t *testing.T) {
		t.Parallel()
		b := withTable(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Claims would take rows only after an hour: the publish below
		// is the after-commit one.
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, PollInterval: time.Hour, LocalGrace: 50 * time.Second})
		require.NoError(t, err)
		go func() { _ = r.Run(ctx) }()
		testenv.Eventually(t, r.Running, "relay running")

		e := newEvent(t, "T-uow")
		err = UnitOfWork{Pool: b.pool, Relay: r}.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO things (id) VALUES ('T-uow')`); err != nil {
				return err
			}
			return Write(ctx, tx, e)
		})
		require.NoError(t, err)
		require.Equal(t, 1, count(t, b, `SELECT count(*) FROM things`))
		testenv.Eventually(t, func() bool { return rowOf(t, b, e.ID()).published }, "published and marked")
		require.Equal(t, []string{e.ID()}, streamIDs(t, b))
	})

	t.Run("AnErrorOfFnRollsBothBackAndIsReturnedUnchanged", func(t *testing.T) {
		t.Parallel()
		b := withTable(t)
		ctx := context.Background()
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js})
		require.NoError(t, err)
		sentinel := errors.New("taken")
		ran := false
		err = UnitOfWork{Pool: b.pool, Relay: r}.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO things (id) VALUES ('T-back')`); err != nil {
				return err
			}
			require.True(t, AfterCommit(ctx, func() { ran = true }))
			if err := Write(ctx, tx, newEvent(t, "T-back")); err != nil {
				return err
			}
			return sentinel
		})
		require.Same(t, sentinel, err)
		require.False(t, ran, "no after-commit work after a rollback")
		require.Zero(t, count(t, b, `SELECT count(*) FROM things`))
		require.Zero(t, count(t, b, `SELECT count(*) FROM outbox`))
	})

	t.Run("ASagaOfItsOwnWritesWithItsRelay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		const requested = "com.example.cinema.booking.requested.v1"
		cat := events.Catalogue{Types: []events.EventType{{Type: requested, Service: "box-office", Stream: "BOOKINGS"}}}
		require.NoError(t, events.EnsureStreamsReplicas(ctx, b.js, cat, 1))
		r, err := NewRelay(RelayConfig{Pool: b.pool, JetStream: b.js, Catalogue: cat})
		require.NoError(t, err)
		e, err := events.New("/cinema/box-office", requested, "B-1042", map[string]any{"trip_id": "B-1042", "request": map[string]string{"seat": "F12"}})
		require.NoError(t, err)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		require.ErrorIs(t, Write(ctx, tx, e), events.ErrInvalidEvent, "outside a unit of work outbox.Write checks against the trip's streams")
		require.NoError(t, tx.Rollback(ctx))
		uow := UnitOfWork{Pool: b.pool, Relay: r} // r is not running
		require.NoError(t, uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return Write(ctx, tx, e) }),
			"inside the saga's unit of work outbox.Write checks against its relay's catalogue, running or not")
		other, err := events.New("/cinema/box-office", requested, "B-1043", map[string]any{"trip_id": "B-1043"})
		require.NoError(t, err)
		require.NoError(t, uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return r.Write(ctx, tx, other) }))
		drain(t, r)
		s, err := b.js.Stream(ctx, "BOOKINGS")
		require.NoError(t, err)
		m, err := s.GetLastMsgForSubject(ctx, "booking.requested.B-1042")
		require.NoError(t, err)
		require.Equal(t, e.ID(), m.Header.Get("Nats-Msg-Id"), "published with the event id as Nats-Msg-Id")
	})
}
