package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/doctor"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
)

func runDoctorCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := doctorCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// TestDoctor runs `tripsaga doctor` against an embedded server: a server
// without streams, the default streams (no violation, exit 0), then a
// memory work-queue CAR stream (two violations, exit non-zero).
func TestDoctor(t *testing.T) {
	srv := testenv.NATS(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv(natsauth.EnvCreds, testenv.Creds(t, srv, natsauth.Admin))

	out, err := runDoctorCmd(t, "--json")
	require.Error(t, err, out)
	var fs []doctor.Finding
	require.NoError(t, json.Unmarshal([]byte(out), &fs), out)
	require.Len(t, fs, len(events.Selected().StreamSubjects())+1, "every stream is missing (and DEADLETTER): %s", out)
	require.Equal(t, doctor.RuleStreamMissing, fs[0].Rule)

	ctx := context.Background()
	js := connectJS(t, srv)
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	out, err = runDoctorCmd(t, "--json")
	require.NoError(t, err, out)
	require.JSONEq(t, "[]", out)
	out, err = runDoctorCmd(t)
	require.NoError(t, err, out)
	require.Contains(t, out, "ok: the configuration on "+srv.ClientURL()+" keeps every guarantee")

	require.NoError(t, js.DeleteStream(ctx, events.StreamCar))
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: events.StreamCar, Subjects: []string{"car.>"}, Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.MemoryStorage, Duplicates: events.DuplicateWindow, MaxAge: events.MaxAge,
	})
	require.NoError(t, err)
	out, err = runDoctorCmd(t, "--json")
	require.ErrorContains(t, err, "2 violations")
	fs = nil
	require.NoError(t, json.Unmarshal([]byte(out), &fs), out)
	require.Len(t, fs, 2, out)
	rules := map[string]doctor.Finding{}
	for _, f := range fs {
		require.Equal(t, "stream CAR", f.Object)
		rules[f.Rule] = f
	}
	require.Contains(t, rules[doctor.RuleStreamStorage].Reason, "loses every event when the NATS server restarts")
	require.Contains(t, rules[doctor.RuleStreamRetention].Reason, "work-queue retention")
	require.NotEmpty(t, rules[doctor.RuleStreamRetention].Source)

	out, err = runDoctorCmd(t)
	require.Error(t, err)
	require.Contains(t, out, "2 violations on "+srv.ClientURL())
	require.Contains(t, out, "stream CAR  [stream-storage]")
	require.Contains(t, out, "rule from: ")
}

func connectJS(t *testing.T, srv *server.Server) jetstream.JetStream {
	t.Helper()
	nc := testenv.Connect(t, srv, natsauth.Admin)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// doctor reports the server's store sync setting from its monitoring port
// (a violation when it is not always), and says it is not known without one.
func TestDoctorSync(t *testing.T) {
	t.Setenv("NATS_MONITOR_URL", "")
	srv, _ := testenv.NATSWith(t, func(o *server.Options) {
		o.HTTPHost, o.HTTPPort = "127.0.0.1", -1
		o.SyncAlways, o.SyncInterval = false, 0 // nats-server's default
	})
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv(natsauth.EnvCreds, testenv.Creds(t, srv, natsauth.Admin))
	require.NoError(t, events.EnsureStreams(context.Background(), connectJS(t, srv), events.Default))

	out, err := runDoctorCmd(t)
	require.NoError(t, err, out)
	require.Contains(t, out, "NATS store sync: not known over the client connection")

	mon := "http://" + srv.MonitorAddr().String()
	out, err = runDoctorCmd(t, "--nats-monitor", mon)
	require.ErrorContains(t, err, "1 violations", out)
	require.Contains(t, out, "NATS store sync: 2m0s (the default): a power loss or OS crash of the NATS host loses the acknowledged events of the last 2m0s")
	require.Contains(t, out, "[nats-sync]")
}
