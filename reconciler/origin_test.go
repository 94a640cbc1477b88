package reconciler

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/saga"
)

// originRequest is the request the trips service took for a trip.
func originRequest(email string) events.TripRequest {
	return events.TripRequest{
		Traveler: events.Person{Name: "Ada", Email: email},
		Hotel:    events.HotelRequest{PropertyID: "P-1", CheckIn: "2026-12-18", Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: "2026-12-18", Return: "2026-12-20"},
		Payment:  events.PaymentRequest{CardToken: "tok_ok", AmountCents: 100, Currency: "USD"},
	}
}

// requested is trip's trip.requested carrying req.
func requested(t *testing.T, trip string, req events.TripRequest) event.Event {
	t.Helper()
	e, err := events.New(events.Source("trips"), events.TripRequested, trip, events.TripRequestedData{TripID: trip, Request: req})
	require.NoError(t, err)
	return e
}

// held is a hotel.held of trip carrying req, stamped at.
func held(t *testing.T, trip string, req events.TripRequest, at time.Time) event.Event {
	t.Helper()
	raw, err := json.Marshal(req)
	require.NoError(t, err)
	e, err := events.New(events.Source("hotel"), events.HotelHeld, trip, events.StepData{
		TripID: trip, Step: "hotel", IdempotencyKey: trip + ":hotel", CompanyRef: "H-1", Request: raw,
	})
	require.NoError(t, err)
	e.SetTime(at)
	return e
}

// TestTheViewParksWhatTheStepServicesPark (issue 19 item 4): a hotel.held
// published with the hotel service's seed for a trip the trips service
// never took made the view show a trip stuck after its hotel, and the
// sweep a finding, though no step service carries out such a trigger (it
// parks it: saga.ServiceConfig.Origin). The projection now checks the
// same triggers the same way: it parks the forged one, projects the one
// its trip.requested backs, waits for one within the grace, and a rebuild
// leaves out what the live view parked.
func TestTheViewParksWhatTheStepServicesPark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, func(c *Config) {
		c.Origin = saga.TripsOrigin(c.JetStream)
		c.OriginGrace = 10 * time.Minute
	})
	b.start(t)
	op, _ := b.operatorServer(t, testToken)
	long := time.Now().Add(-time.Hour) // past the grace
	req := originRequest("ada@example.com")

	// A trigger no trip.requested backs, past the grace: parked.
	forged := held(t, "T-ORIGIN-FORGED", req, long)
	b.publish(t, forged, "")
	// One whose trip.requested is there: projected.
	b.publish(t, requested(t, "T-ORIGIN-TAKEN", req), "")
	taken := held(t, "T-ORIGIN-TAKEN", req, long)
	b.publish(t, taken, "")
	// One carrying another request than its trip's: parked too.
	b.publish(t, requested(t, "T-ORIGIN-OTHER", req), "")
	testenv.Eventually(t, b.caughtUp, "projection caught up")
	_, err := b.pool.Exec(ctx, "DELETE FROM trip_view WHERE trip_id = 'T-ORIGIN-OTHER'")
	require.NoError(t, err) // so the guard asks the stream, not the view
	other := held(t, "T-ORIGIN-OTHER", originRequest("mallory@example.com"), long)
	b.publish(t, other, "")
	testenv.Eventually(t, b.caughtUp, "projection caught up")

	_, found := b.viewOf(t, "T-ORIGIN-FORGED")
	require.False(t, found, "no trip row for a trigger nobody requested")
	v, found := b.viewOf(t, "T-ORIGIN-TAKEN")
	require.True(t, found)
	require.Equal(t, []string{"hotel.held", "trip.requested"}, v.Seen)
	_, found = b.viewOf(t, "T-ORIGIN-OTHER")
	require.False(t, found, "the differing trigger was not projected")

	dls, err := op.DeadLetters(ctx)
	require.NoError(t, err)
	reasons := map[string]string{}
	for _, d := range dls {
		require.Equal(t, ProjectionName, d.Consumer)
		reasons[d.EventID] = d.Reason
	}
	require.Len(t, reasons, 2, "%v", reasons)
	require.Contains(t, reasons[forged.ID()], "no trip.requested for T-ORIGIN-FORGED")
	require.Contains(t, reasons[other.ID()], "request differs")
	require.Contains(t, reasons[other.ID()], "traveler.email")
	require.NotContains(t, reasons, taken.ID())

	b.sweep(t)
	for k, f := range b.open(t) {
		require.NotEqual(t, "T-ORIGIN-FORGED", f.TripID, "no finding of a trip nobody requested: %s", k)
	}

	// Within the grace, a trigger waits for its trip.requested (whose
	// stream may have lost it, and the trips outbox publishes it again),
	// then is projected.
	early := held(t, "T-ORIGIN-EARLY", req, time.Now())
	b.publish(t, early, "")
	testenv.Eventually(t, func() bool {
		c, err := b.js.Consumer(ctx, events.StreamHotel, ProjectionName)
		if err != nil {
			return false
		}
		i, err := c.Info(ctx)
		return err == nil && i.NumRedelivered > 0 // handled, failed, delivered again
	}, "the early trigger is retried")
	_, found = b.viewOf(t, "T-ORIGIN-EARLY")
	require.False(t, found, "not projected before its trip.requested")
	b.publish(t, requested(t, "T-ORIGIN-EARLY", req), "")
	testenv.Eventually(t, func() bool {
		v, ok := b.viewOf(t, "T-ORIGIN-EARLY")
		return ok && len(v.Seen) == 2
	}, "the early trigger is projected once its trip.requested came")

	// A rebuild leaves out what the live view parked.
	stats, err := Replay(ctx, ReplayConfig{Pool: b.pool, JetStream: b.js, BatchSize: 2, Origin: saga.TripsOrigin(b.js), OriginGrace: 10 * time.Minute})
	require.NoError(t, err)
	require.Equal(t, 1, stats.NoOrigin, "the forged trigger; the differing one's trip has its trip.requested in the view")
	_, found = b.viewOf(t, "T-ORIGIN-FORGED")
	require.False(t, found, "the rebuild shows no trip the live view refused")
	for _, trip := range []string{"T-ORIGIN-TAKEN", "T-ORIGIN-EARLY"} {
		v, found := b.viewOf(t, trip)
		require.True(t, found, trip)
		require.Equal(t, []string{"hotel.held", "trip.requested"}, v.Seen, trip)
	}
}
