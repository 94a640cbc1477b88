package natsauth

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
)

// The optional insurance step gets its identity from the catalogue, with
// nothing of its own: with STEPS naming it, it publishes only its events
// (stream INSURANCE) and consumes what the catalogue says; with the step
// off there is no such identity.
func TestInsuranceIdentityFollowsTheCatalogue(t *testing.T) {
	_, ok := Lookup(events.Default, "insurance")
	require.False(t, ok, "no identity with the step off")
	id, ok := Lookup(events.Full(), "insurance")
	require.True(t, ok)
	require.Equal(t, []string{events.StreamInsurance}, id.OwnStreams)
	for _, subj := range id.Events {
		require.Regexp(t, `^insurance\.`, subj, "it publishes its own events only")
	}
	var streams []string
	for _, c := range id.Consumers {
		streams = append(streams, c.Stream)
	}
	require.Contains(t, streams, events.StreamHotel, "hotel.held starts it")
	require.Contains(t, streams, events.StreamPayment, "the payment's endings compensate it")
	pay, _ := Lookup(events.Full(), "payment")
	var payStreams []string
	for _, c := range pay.Consumers {
		payStreams = append(payStreams, c.Stream)
	}
	require.Contains(t, payStreams, events.StreamInsurance, "insurance.bought starts the payment")
}
