package replay_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/replay"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// publish stores a trip.requested of trip on TRIPS and returns its
// sequence and stored time.
func publish(t *testing.T, js jetstream.JetStream, trip string) (uint64, time.Time) {
	t.Helper()
	e, err := events.New(events.Source("trips"), events.TripRequested, trip, events.TripRequestedData{TripID: trip})
	require.NoError(t, err)
	h, err := events.EncodeHeaders(e)
	require.NoError(t, err)
	m := &nats.Msg{Subject: "trip.requested." + trip, Data: e.Data(), Header: nats.Header{}}
	for k, v := range h {
		m.Header.Set(k, v)
	}
	ack, err := js.PublishMsg(context.Background(), m, jetstream.WithMsgID(e.ID()))
	require.NoError(t, err)
	s, err := js.Stream(context.Background(), events.StreamTrips)
	require.NoError(t, err)
	raw, err := s.GetMsg(context.Background(), ack.Sequence)
	require.NoError(t, err)
	return ack.Sequence, raw.Time
}

// TestResetFromATimeAndDryRun: the durable consumer "hotel" (acked up to
// the end, as a running service leaves it) is moved back to the first
// event stored at or after a time and gets those again; a dry run of one
// trip lists its events and moves nothing.
func TestResetFromATimeAndDryRun(t *testing.T) {
	ctx := context.Background()
	_, _, js := testenv.JetStream(t)
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	var times []time.Time
	for i := range 5 {
		_, at := publish(t, js, fmt.Sprintf("T-r%d", i))
		times = append(times, at)
	}
	cons, err := js.CreateConsumer(ctx, events.StreamTrips, jetstream.ConsumerConfig{
		Durable: "hotel", FilterSubjects: []string{"trip.requested.>"}, AckPolicy: jetstream.AckExplicitPolicy,
	})
	require.NoError(t, err)
	// The service: acks whatever it is given.
	cc, err := cons.Consume(func(m jetstream.Msg) { _ = m.Ack() })
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	idle := func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.AckFloor.Stream == 5
	}
	testenv.Eventually(t, idle, "the service took every event")

	_, err = replay.Run(ctx, replay.Config{JetStream: js, Consumer: "hotel"})
	require.ErrorIs(t, err, replay.ErrInvalid, "a point to replay from is required")
	_, err = replay.Run(ctx, replay.Config{JetStream: js, Consumer: "flights", FromSeq: 1})
	require.ErrorContains(t, err, `"flights" consumes nothing`)

	var out bytes.Buffer
	res, err := replay.Run(ctx, replay.Config{JetStream: js, Consumer: "hotel", Stream: events.StreamTrips, Since: times[2], Trip: "T-r3", DryRun: true, Out: &out})
	require.NoError(t, err)
	require.Equal(t, "dry-run", res.Mode)
	require.Equal(t, 1, res.Events)
	require.Contains(t, out.String(), "T-r3")
	require.Equal(t, 1, strings.Count(out.String(), "\n"))
	ci, err := cons.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 5, ci.AckFloor.Stream, "a dry run moves nothing")

	var bar bytes.Buffer
	res, err = replay.Run(ctx, replay.Config{JetStream: js, Consumer: "hotel", Stream: events.StreamTrips, Since: times[2], Progress: &bar})
	require.NoError(t, err)
	require.Equal(t, "reset", res.Mode)
	require.Equal(t, []replay.StreamResult{{Stream: events.StreamTrips, From: 3, To: 5, Events: 3}}, res.Streams)
	require.Positive(t, res.EventsPerSecond())
	require.Contains(t, bar.String(), "events")
	require.True(t, idle(), "the consumer acked them again")
}

// TestFromSeqExactlyOrRefused (issue 17): --from-seq N re-delivers every
// event of the consumer's from N to the stream's end, and says so, or
// refuses before it moves anything: N before the stream's first sequence
// (purged, aged out, or the stream made again), after its last, or before
// where the consumer starts (JetStream cannot reset a consumer below its
// start). It never moves the start silently and reports a count it did
// not deliver.
func TestFromSeqExactlyOrRefused(t *testing.T) {
	ctx := context.Background()
	_, _, js := testenv.JetStream(t)
	for i := range 6 {
		publish(t, js, fmt.Sprintf("T-f%d", i))
	}
	// The consumer as the old inbox left it on a stream made again: it
	// starts at #5.
	cons, err := js.CreateConsumer(ctx, events.StreamTrips, jetstream.ConsumerConfig{
		Durable: "hotel", FilterSubjects: []string{"trip.requested.>"}, AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 5,
	})
	require.NoError(t, err)
	delivered := make(chan uint64, 100)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err == nil {
			delivered <- md.Sequence.Stream
		}
		_ = m.Ack()
	})
	require.NoError(t, err)
	defer cc.Stop()
	idle := func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.AckFloor.Stream == 6
	}
	testenv.Eventually(t, idle, "the service took #5 and #6")
	drain := func() []uint64 {
		var got []uint64
		for {
			select {
			case s := <-delivered:
				got = append(got, s)
			default:
				return got
			}
		}
	}
	require.Equal(t, []uint64{5, 6}, drain())
	run := func(from uint64, dry bool) (replay.Result, error) {
		return replay.Run(ctx, replay.Config{JetStream: js, Consumer: "hotel", Stream: events.StreamTrips, FromSeq: from, DryRun: dry})
	}

	_, err = run(1, false)
	require.ErrorIs(t, err, replay.ErrRefused)
	require.ErrorContains(t, err, "starts at #5")
	_, err = run(7, false)
	require.ErrorIs(t, err, replay.ErrRefused)
	require.ErrorContains(t, err, "ends at #6")
	_, err = run(7, true)
	require.ErrorIs(t, err, replay.ErrRefused, "a dry run refuses the same")
	require.Empty(t, drain(), "a refused replay delivers nothing")

	res, err := run(5, false)
	require.NoError(t, err)
	require.Equal(t, []replay.StreamResult{{Stream: events.StreamTrips, From: 5, To: 6, Events: 2}}, res.Streams)
	testenv.Eventually(t, idle, "acked again")
	require.ElementsMatch(t, []uint64{5, 6}, drain(), "the 2 it reports are the 2 it delivered")

	// The consumer made again to deliver all (as the inbox now does on a
	// new stream): from #1 it is all six; after #1..#2 are purged, #1
	// is refused and #3 is exact.
	cc.Stop()
	require.NoError(t, js.DeleteConsumer(ctx, events.StreamTrips, "hotel"))
	cons, err = js.CreateConsumer(ctx, events.StreamTrips, jetstream.ConsumerConfig{
		Durable: "hotel", FilterSubjects: []string{"trip.requested.>"}, AckPolicy: jetstream.AckExplicitPolicy,
	})
	require.NoError(t, err)
	cc, err = cons.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err == nil {
			delivered <- md.Sequence.Stream
		}
		_ = m.Ack()
	})
	require.NoError(t, err)
	defer cc.Stop()
	testenv.Eventually(t, idle, "the new consumer took all six")
	require.Len(t, drain(), 6)
	res, err = run(1, false)
	require.NoError(t, err)
	require.Equal(t, 6, res.Events)
	testenv.Eventually(t, idle, "acked again")
	require.ElementsMatch(t, []uint64{1, 2, 3, 4, 5, 6}, drain())

	s, err := js.Stream(ctx, events.StreamTrips)
	require.NoError(t, err)
	require.NoError(t, s.Purge(ctx, jetstream.WithPurgeSequence(3)))
	_, err = run(1, false)
	require.ErrorIs(t, err, replay.ErrRefused)
	require.ErrorContains(t, err, "no longer in it")
	res, err = run(3, true)
	require.NoError(t, err)
	require.Equal(t, 4, res.Events, "a dry run from #3 lists #3..#6")
	res, err = run(3, false)
	require.NoError(t, err)
	require.Equal(t, []replay.StreamResult{{Stream: events.StreamTrips, From: 3, To: 6, Events: 4}}, res.Streams)
	testenv.Eventually(t, idle, "acked again")
	require.ElementsMatch(t, []uint64{3, 4, 5, 6}, drain())
}
