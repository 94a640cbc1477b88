package inbox

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are shared by all inboxes of a process.
type Metrics struct {
	events *prometheus.CounterVec
	lost   *prometheus.CounterVec
}

// Reasons an inbox gives for a lost consumer, the reason label of
// tripsaga_inbox_consumer_lost_total.
const (
	// LostDeleted: the server told a waiting pull request that the
	// consumer was deleted (409 Consumer Deleted, jetstream.ErrConsumerDeleted).
	LostDeleted = "deleted"
	// LostMissing: the consumer's info answered consumer not found
	// (jetstream.ErrConsumerNotFound), e.g. it was deleted while no pull
	// request was waiting, or the stream was restored without it.
	LostMissing = "missing"
	// LostReplaced: a consumer of that name exists but was created after
	// ours (another creation time): someone deleted and recreated it.
	LostReplaced = "replaced"
	// LostReset: the consumer's ack floor went back (a reset, or a stream
	// restored under it): events after it come again, which the inbox
	// drops as duplicates.
	LostReset = "reset"
	// LostStopped: the client stopped consuming by itself (a bad request
	// answer, the connection closed).
	LostStopped = "stopped"
	// LostStreamReplaced: the stream is not the one the inbox's position
	// counts on: it was deleted and made again (another creation time), or
	// restored from an older store (its last sequence went back). The
	// consumer reads the new stream from its first message; the inbox table
	// drops the events it handled already.
	LostStreamReplaced = "stream_replaced"
)

// NewMetrics registers the inbox counters on reg:
// tripsaga_inbox_events_total{consumer,outcome} and
// tripsaga_inbox_consumer_lost_total{consumer,stream,reason}.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tripsaga_inbox_events_total",
		Help: "Events seen by inbox consumers, by outcome (handled, duplicate, retried, parked).",
	}, []string{"consumer", "outcome"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tripsaga_inbox_consumer_lost_total",
			Help: "Durable consumers an inbox found deleted, missing, replaced, reset or stopped, and recreated or took up again.",
		}, []string{"consumer", "stream", "reason"})}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.events, m.lost} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("inbox metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *Metrics) incLost(consumer, stream, reason string) {
	if m != nil {
		m.lost.WithLabelValues(consumer, stream, reason).Inc()
	}
}

func (m *Metrics) inc(consumer, outcome string) {
	if m != nil {
		m.events.WithLabelValues(consumer, outcome).Inc()
	}
}
