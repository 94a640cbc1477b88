package chaos

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
)

func TestParseDisruptions(t *testing.T) {
	got, err := ParseDisruptions("lose-acked, kill,kill", 0)
	require.NoError(t, err)
	require.Equal(t, []string{DisruptKill, DisruptLoseAcked}, got, "sorted, each once")

	got, err = ParseDisruptions("all", 3)
	require.NoError(t, err)
	require.ElementsMatch(t, Disruptions, got)

	got, err = ParseDisruptions("all", 0)
	require.NoError(t, err)
	require.Equal(t, []string{DisruptKill, DisruptLoseAcked, DisruptPartition}, got, "all without a cluster leaves out what needs one")

	_, err = ParseDisruptions("step-down", 0)
	require.ErrorContains(t, err, "step-down needs a NATS cluster")
	_, err = ParseDisruptions("kill,partitoin", 3)
	require.ErrorContains(t, err, `unknown kind "partitoin"`)
}

func TestParseDisruptionsOnReplicas(t *testing.T) {
	got, err := ParseDisruptionsOn("partition,kill", 0, 2)
	require.NoError(t, err)
	require.Equal(t, []string{DisruptKill, DisruptPartition}, got)

	_, err = ParseDisruptionsOn("kill, partition", 3, 1)
	require.ErrorContains(t, err, "partition needs --replicas 2 or more")

	got, err = ParseDisruptionsOn("all", 3, 1)
	require.NoError(t, err)
	require.NotContains(t, got, DisruptPartition, "all with one replica leaves the partition out")
	require.Contains(t, got, DisruptStepDown)

	got, err = ParseDisruptionsOn("all", 0, 2)
	require.NoError(t, err)
	require.Equal(t, []string{DisruptKill, DisruptLoseAcked, DisruptPartition}, got)

	_, err = ParseDisruptionsOn("step-down", 0, 2)
	require.ErrorContains(t, err, "step-down needs a NATS cluster")
}

func TestProcessOfAnInstance(t *testing.T) {
	for in, want := range map[string]string{"hotel": "hotel", "hotel-2": "hotel", "reconciler-12": "reconciler", "nats-1": "nats", "sim": "sim"} {
		require.Equal(t, want, processOf(in), in)
	}
}

// The partition's counts read the services' log lines as slog's text
// handler writes them (saga/liveness.go's messages and attributes).
func TestPartitionLogLinesAreRead(t *testing.T) {
	var b strings.Builder
	log := slog.New(slog.NewTextHandler(&b, nil)).With("service", "hotel")
	log.Error("saga: liveness: no beat confirmed by PostgreSQL for the fence bound: starting no company call until one is; peers may take this process's leases",
		"process_id", int32(7), "fence_after", 3*time.Second, "takeover_after", 6*time.Second)
	log.Warn("saga: took over a lease of a dead process", "trip_id", "T-1", "step", "hotel", "dead_process_id", int32(7))
	log.Warn("saga: took over a lease of a dead process", "trip_id", "T-2", "step", "hotel", "dead_process_id", int32(8))
	m := fenceLine.FindAllStringSubmatch(b.String(), -1)
	require.Len(t, m, 1)
	require.Equal(t, "7", m[0][1])
	var dead []string
	for _, m := range takeoverLine.FindAllStringSubmatch(b.String(), -1) {
		dead = append(dead, m[1])
	}
	require.Equal(t, []string{"7", "8"}, dead)
}

// TestStepDownRequestAskedAgainUntilAnswered: a JetStream API request of
// the disruptions that gets no answer (a stream or consumer without a
// leader while one is elected: only the leader answers its step-down) is
// asked again until one answers, instead of waiting for ever on the run's
// context, which has no deadline (it stopped every later disruption of a
// run); it gives up with an error past its wait.
func TestStepDownRequestAskedAgainUntilAnswered(t *testing.T) {
	// No JetStream: the test's own responder is the only one listening.
	srv, _ := testenv.NATSWith(t, func(o *server.Options) { o.JetStream = false })
	nc := testenv.Connect(t, srv, natsauth.Admin)
	const subject = "$JS.API.STREAM.LEADER.STEPDOWN.TRIPS"
	var asked atomic.Int32
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		if asked.Add(1) < 3 {
			return // no leader yet: no answer
		}
		_ = m.Respond([]byte(`{"type":"io.nats.jetstream.api.v1.stream_leader_stepdown_response","success":true}`))
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	d := &disruptor{nc: nc, timeout: 200 * time.Millisecond, wait: time.Minute}
	msg, err := d.request(context.Background(), subject) // no deadline, as a run's
	require.NoError(t, err)
	require.Contains(t, string(msg.Data), `"success":true`)
	require.EqualValues(t, 3, asked.Load(), "asked until answered, and not again after")

	require.NoError(t, sub.Unsubscribe())
	silent, err := nc.Subscribe(subject, func(*nats.Msg) {}) // never answers
	require.NoError(t, err)
	defer func() { _ = silent.Unsubscribe() }()
	require.NoError(t, nc.Flush())
	d.wait = time.Second
	_, err = d.request(context.Background(), subject)
	require.ErrorIs(t, err, context.DeadlineExceeded, "gives up past its wait")
}
