package natsauth

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
)

// Every step service, in both catalogues, may read the messages of TRIPS:
// it checks a trigger's trip.requested there (saga.TripsOrigin).
func TestStepServicesReadTripRequested(t *testing.T) {
	for _, c := range []events.Catalogue{events.Default, events.Full()} {
		for _, st := range c.Steps {
			id := MustLookup(c, st.Service)
			require.Contains(t, id.JetStreamAPI(), "$JS.API.STREAM.MSG.GET."+events.StreamTrips, st.Service)
		}
	}
}
