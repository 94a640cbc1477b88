package trips

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
)

// With the insurance step on (STEPS=hotel,insurance,payment,car) a trip is
// canceled only once the hold and the policy that happened are undone.
func TestProjectWithInsurance(t *testing.T) {
	t.Setenv(events.StepsVar, "hotel,insurance,payment,car")
	cases := []struct {
		seen []string
		want string
	}{
		{[]string{"hotel.held", "insurance.bought", "payment.charged"}, StatusPending},
		{[]string{"hotel.held", "insurance.bought", "payment.charged", "car.booked"}, StatusConfirmed},
		{[]string{"hotel.held", "insurance.rejected"}, StatusCanceling},
		{[]string{"hotel.held", "insurance.rejected", "hotel.released"}, StatusCanceled},
		{[]string{"insurance.failed", "hotel.released"}, StatusCanceled},
		{[]string{"hotel.held", "insurance.bought", "payment.declined", "hotel.released"}, StatusCanceling},
		{[]string{"payment.declined", "insurance.canceled"}, StatusCanceling},
		{[]string{"payment.declined", "insurance.canceled", "hotel.released"}, StatusCanceled},
		{[]string{"car.rejected", "payment.refunded", "insurance.canceled"}, StatusCanceling},
		{[]string{"car.failed", "payment.refunded", "insurance.canceled", "hotel.released"}, StatusCanceled},
	}
	for _, c := range cases {
		require.Equal(t, c.want, Project(events.Selected(), c.seen), "%v", c.seen)
	}
	require.Equal(t, map[string]string{"hotel": "released", "insurance": "rejected", "payment": "skipped", "car": "skipped"},
		Steps(events.Selected(), []string{"hotel.held", "insurance.rejected", "hotel.released"}, StatusCanceled))
	require.Equal(t, map[string]string{"hotel": "held", "insurance": "bought", "payment": "pending", "car": "pending"},
		Steps(events.Selected(), []string{"hotel.held", "insurance.bought"}, StatusPending))
	require.Equal(t, "the insurer refused to insure the trip", FailureReason("insurance.rejected"))
}
