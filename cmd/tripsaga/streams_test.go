package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
)

func runStreamsCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := streamsCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// TestStreamsApply runs `tripsaga streams apply` against a fresh embedded
// server: every stream of the catalogue and DEADLETTER is created (and
// doctor, which requires them, then finds nothing), a second run changes
// nothing, a stream someone changed is updated back and one deleted is
// created again; a service's identity may not run it.
func TestStreamsApply(t *testing.T) {
	srv := testenv.NATS(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv(natsauth.EnvCreds, testenv.Creds(t, srv, natsauth.Admin))
	all := len(events.Selected().StreamSubjects()) + 1

	actions := func(t *testing.T, args ...string) map[string]string {
		t.Helper()
		out, err := runStreamsCmd(t, append([]string{"apply", "--json"}, args...)...)
		require.NoError(t, err, out)
		var cs []events.StreamChange
		require.NoError(t, json.Unmarshal([]byte(out), &cs), out)
		got := map[string]string{}
		for _, c := range cs {
			got[c.Stream] = c.Action
		}
		require.Len(t, got, all, out)
		return got
	}
	for s, a := range actions(t) {
		require.Equal(t, events.StreamCreated, a, s)
	}
	out, err := runDoctorCmd(t, "--json")
	require.NoError(t, err, "doctor requires every stream: %s", out)

	for s, a := range actions(t) {
		require.Equal(t, events.StreamUnchanged, a, "a second apply changes nothing: %s", s)
	}

	ctx := context.Background()
	js := connectJS(t, srv)
	st, err := js.Stream(ctx, events.StreamPayment)
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	cfg.MaxAge = events.MaxAge / 2
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, js.DeleteStream(ctx, events.StreamOperator))
	got := actions(t)
	require.Equal(t, events.StreamUpdated, got[events.StreamPayment])
	require.Equal(t, events.StreamCreated, got[events.StreamOperator])
	require.Equal(t, events.StreamUnchanged, got[events.StreamHotel])
	st, err = js.Stream(ctx, events.StreamPayment)
	require.NoError(t, err)
	require.Equal(t, events.MaxAge, st.CachedInfo().Config.MaxAge, "updated back to the catalogue's settings")

	out, err = runStreamsCmd(t, "apply")
	require.NoError(t, err, out)
	require.Contains(t, out, "OPERATOR")
	require.Contains(t, out, "reconciler")
	require.Contains(t, out, "streams on "+srv.ClientURL()+": 0 created, 0 updated,")

	// A service's identity may create only its own stream.
	t.Setenv(natsauth.EnvCreds, testenv.Creds(t, srv, "hotel"))
	require.NoError(t, js.DeleteStream(ctx, events.StreamCar))
	out, err = runStreamsCmd(t, "apply", "--wait", "3s")
	require.Error(t, err, out)
	_, err = js.Stream(ctx, events.StreamCar)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
}
