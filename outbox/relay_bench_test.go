package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
)

// BenchmarkRelayDrain reports how fast one relay drains a backlog of
// b.N events written 100 per transaction (events/s). The tests' PostgreSQL
// runs with fsync off; `tripsaga bench` measures it on durable settings.
func BenchmarkRelayDrain(b *testing.B) {
	bb := setupB(b)
	ctx := context.Background()
	for i := 0; i < b.N; i += 100 {
		var evs []event.Event
		for j := i; j < min(i+100, b.N); j++ {
			e, err := events.New(events.Source("hotel"), events.HotelHeld, fmt.Sprintf("T-%d", j), events.StepData{TripID: fmt.Sprintf("T-%d", j), Step: "hotel"})
			require.NoError(b, err)
			evs = append(evs, e)
		}
		tx, err := bb.pool.Begin(ctx)
		require.NoError(b, err)
		require.NoError(b, Write(ctx, tx, evs...))
		require.NoError(b, tx.Commit(ctx))
	}
	r, err := NewRelay(RelayConfig{Pool: bb.pool, JetStream: bb.js, BatchSize: RelayBatchSizeDefault})
	require.NoError(b, err)
	b.ResetTimer()
	start := time.Now()
	total := 0
	for {
		n, err := r.PublishBatch(ctx)
		require.NoError(b, err)
		if n == 0 {
			break
		}
		total += n
	}
	b.ReportMetric(float64(total)/time.Since(start).Seconds(), "events/s")
	require.Equal(b, b.N, total)
}
