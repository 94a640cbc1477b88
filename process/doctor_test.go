package process_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/doctor"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/services/hotel"
)

// TestServiceRefusesToStartOnViolation: the hotel service, started on a
// server whose HOTEL stream is in memory, refuses to start, naming the
// violation, and leaves the stream as it found it.
func TestServiceRefusesToStartOnViolation(t *testing.T) {
	ctx := context.Background()
	srv := testenv.NATS(t)
	nc := testenv.Connect(t, srv, natsauth.Admin)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: events.StreamHotel, Subjects: []string{"hotel.>"}, Storage: jetstream.MemoryStorage,
		Duplicates: events.DuplicateWindow, MaxAge: events.MaxAge,
	})
	require.NoError(t, err)

	env := process.Env{
		NATSURL: srv.ClientURL(), DatabaseURL: testenv.Postgres(t), HTTPAddr: "127.0.0.1:0",
		Companies: map[string]string{"hotel": "http://127.0.0.1:1"}, NATSClient: testenv.Client(t, srv, "hotel"),
	}
	err = hotel.Run(ctx, env)
	require.ErrorIs(t, err, doctor.ErrViolation)
	require.ErrorContains(t, err, "refusing to start")
	require.ErrorContains(t, err, "stream HOTEL: "+doctor.RuleStreamStorage+": ")

	s, err := js.Stream(ctx, events.StreamHotel)
	require.NoError(t, err)
	require.Equal(t, jetstream.MemoryStorage, s.CachedInfo().Config.Storage)
	_, err = js.Stream(ctx, events.StreamCar)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound, "no stream was created")
}

// TestServiceRefusesReplicasAboveTheCluster (issue 6 items 2 and 7): a
// service asked for streams of 3 replicas (STREAM_REPLICAS=3) on a single
// server refuses to start, naming the rule, and creates nothing.
func TestServiceRefusesReplicasAboveTheCluster(t *testing.T) {
	ctx := context.Background()
	srv := testenv.NATS(t)
	t.Setenv(events.StreamReplicasEnv, "3")
	env, err := process.EnvFromOS()
	require.NoError(t, err)
	require.Equal(t, 3, env.StreamReplicas)
	env.NATSURL, env.DatabaseURL, env.HTTPAddr = srv.ClientURL(), testenv.Postgres(t), "127.0.0.1:0"
	env.Companies = map[string]string{"hotel": "http://127.0.0.1:1"}
	env.NATSClient = testenv.Client(t, srv, "hotel")
	err = hotel.Run(ctx, env)
	require.ErrorIs(t, err, doctor.ErrViolation)
	require.ErrorContains(t, err, doctor.RuleStreamReplicas)
	require.ErrorContains(t, err, "3 replicas but the cluster has 1 server")

	nc := testenv.Connect(t, srv, natsauth.Admin)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.Stream(ctx, events.StreamHotel)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound, "no stream was created")
}

func TestStreamReplicasFromEnv(t *testing.T) {
	t.Setenv(events.StreamReplicasEnv, "")
	env, err := process.EnvFromOS()
	require.NoError(t, err)
	require.Equal(t, 1, env.StreamReplicas)
	for _, bad := range []string{"0", "6", "three", "-1"} {
		t.Setenv(events.StreamReplicasEnv, bad)
		_, err := process.EnvFromOS()
		require.ErrorContains(t, err, events.StreamReplicasEnv+"=")
	}
}

// TestStreamDuplicateWindowFromEnv: STREAM_DUPLICATE_WINDOW_MS sets the
// window every stream is created and updated with; a value outside
// 60 s .. 30 days is refused at start, naming the variable.
func TestStreamDuplicateWindowFromEnv(t *testing.T) {
	t.Setenv(events.DuplicateWindowEnv, "")
	d, err := events.StreamDuplicateWindow()
	require.NoError(t, err)
	require.Equal(t, events.DuplicateWindow, d)
	for _, bad := range []string{"59999", "2592000001", "20s", "-1"} {
		t.Setenv(events.DuplicateWindowEnv, bad)
		_, err := process.EnvFromOS()
		require.ErrorContains(t, err, events.DuplicateWindowEnv+"=", bad)
	}

	t.Setenv(events.DuplicateWindowEnv, "60000")
	ctx := context.Background()
	srv := testenv.NATS(t)
	js, err := jetstream.New(testenv.Connect(t, srv, natsauth.Admin))
	require.NoError(t, err)
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	s, err := js.Stream(ctx, events.StreamPayment)
	require.NoError(t, err)
	require.Equal(t, 60*time.Second, s.CachedInfo().Config.Duplicates)

	t.Setenv(events.DuplicateWindowEnv, "")
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	s, err = js.Stream(ctx, events.StreamPayment)
	require.NoError(t, err)
	require.Equal(t, events.DuplicateWindow, s.CachedInfo().Config.Duplicates, "a process of the default puts the default back")
}
