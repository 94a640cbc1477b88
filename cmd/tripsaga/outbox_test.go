package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/outbox"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func runOutboxCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := outboxCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestOutboxListAndRedrive(t *testing.T) {
	ctx := context.Background()
	pool, url := testenv.SchemaPool(t, "hotel", tripsql.SetSaga)
	t.Setenv("DATABASE_URL", url)
	t.Setenv("NATS_URL", "nats://127.0.0.1:1") // not used; keeps a local up out of it
	_, err := pool.Exec(ctx, `INSERT INTO outbox (event_id, nats_subject, headers, data, attempts, last_cause, last_error, last_failed_at, quarantined_at)
		VALUES ('E-bad', 'hotel.held.T-1', '{}', '\x7b7d', 50, 'refused', 'nats: API error: code=400 err_code=10054 description=message size exceeds maximum allowed', now(), now()),
		       ('E-wait', 'hotel.held.T-2', '{}', '\x7b7d', 0, 'storage', 'insufficient resources', now(), NULL)`)
	require.NoError(t, err)

	out, err := runOutboxCmd(t, "list", "--json", "--service", "hotel")
	require.NoError(t, err, out)
	var rows []struct {
		Service     string `json:"service"`
		EventID     string `json:"event_id"`
		Quarantined bool   `json:"quarantined"`
		Cause       string `json:"cause"`
		LastError   string `json:"last_error"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.Len(t, rows, 1, "without --waiting only quarantined events")
	require.Equal(t, "hotel", rows[0].Service)
	require.Equal(t, "E-bad", rows[0].EventID)
	require.Equal(t, "refused", rows[0].Cause)
	require.Contains(t, rows[0].LastError, "10054")

	out, err = runOutboxCmd(t, "list", "--waiting", "--service", "hotel")
	require.NoError(t, err, out)
	require.Contains(t, out, "E-bad")
	require.Contains(t, out, "quarantined")
	require.Contains(t, out, "E-wait")
	require.Contains(t, out, "storage")

	_, err = runOutboxCmd(t, "redrive", "--service", "hotel")
	require.ErrorContains(t, err, "--all", "re-driving everything must be asked for")
	_, err = runOutboxCmd(t, "list", "--service", "flights")
	require.ErrorContains(t, err, `--service "flights"`)

	out, err = runOutboxCmd(t, "redrive", "--service", "hotel", "E-bad", "E-wait")
	require.ErrorContains(t, err, "not quarantined in the outbox of hotel", "an id that was not re-driven is named")
	require.ErrorContains(t, err, "E-wait")
	require.NotContains(t, err.Error(), "E-bad")
	require.Contains(t, out, "1 events re-driven")
	var quarantined bool
	var attempts int
	require.NoError(t, pool.QueryRow(ctx, "SELECT quarantined_at IS NOT NULL, attempts FROM outbox WHERE event_id = 'E-bad'").Scan(&quarantined, &attempts))
	require.False(t, quarantined)
	require.Zero(t, attempts, "a re-driven event gets a fresh count of refusals")

	out, err = runOutboxCmd(t, "list", "--service", "hotel")
	require.NoError(t, err)
	require.Contains(t, out, "no quarantined outbox events (events waiting after a failed publish: --waiting)",
		"without --waiting it does not claim nothing waits (E-wait does)")
}

// outbox verify finds a published event whose message was deleted from
// its stream, names it, exits non-zero, and puts it back in line.
func TestOutboxVerify(t *testing.T) {
	ctx := context.Background()
	pool, url := testenv.SchemaPool(t, "hotel", tripsql.SetSaga)
	srv, _, js := testenv.JetStream(t)
	t.Setenv("DATABASE_URL", url)
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv(natsauth.EnvCreds, testenv.Creds(t, srv, natsauth.Admin))
	var evs []string
	for _, trip := range []string{"T-1", "T-2"} {
		e, err := events.New(events.Source("hotel"), events.HotelHeld, trip, events.StepData{TripID: trip, Step: "hotel"})
		require.NoError(t, err)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, outbox.Write(ctx, tx, e))
		require.NoError(t, tx.Commit(ctx))
		evs = append(evs, e.ID())
	}
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, JetStream: js, VerifyInterval: -1})
	require.NoError(t, err)
	n, err := r.PublishBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	out, err := runOutboxCmd(t, "verify", "--service", "hotel")
	require.NoError(t, err, out)
	require.Contains(t, out, "hotel    2 events read back, 0 outside their stream's sequences, 0 lost")

	s, err := js.Stream(ctx, events.StreamHotel)
	require.NoError(t, err)
	require.NoError(t, s.DeleteMsg(ctx, 1))
	out, err = runOutboxCmd(t, "verify", "--service", "hotel")
	require.ErrorContains(t, err, "1 published events were lost")
	require.Contains(t, out, "lost  "+evs[0]+"  HOTEL seq 1 (not found)")
	var cause string
	require.NoError(t, pool.QueryRow(ctx, "SELECT last_cause FROM outbox WHERE event_id = $1 AND published_at IS NULL", evs[0]).Scan(&cause))
	require.Equal(t, "lost", cause, "put back in line")

	out, err = runOutboxCmd(t, "verify", "--service", "hotel", "--since", "0s")
	require.ErrorContains(t, err, "--since 0s: must be positive", out)
}
