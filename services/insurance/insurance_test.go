package insurance

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
)

// The policy covers the stay and the car, whichever starts first and ends
// last, and insures what the card is charged.
func TestBuildCoversStayAndCar(t *testing.T) {
	req := events.TripRequest{
		Traveler: events.Person{Name: "Ada Example", Email: "ada@example.com"},
		Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: "2031-05-02", Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: "2031-05-01", Return: "2031-05-03"},
		Payment:  events.PaymentRequest{CardToken: "tok_visa_ok", AmountCents: 33001, Currency: "EUR"},
	}
	got, err := Build("T-1", req)
	require.NoError(t, err)
	require.Equal(t, PolicyRequest{TripID: "T-1", Traveler: req.Traveler, Start: "2031-05-01", End: "2031-05-04", TripCostCents: 33001, Currency: "EUR"}, got,
		"from the pickup (before check-in) to the check-out (after the return)")

	req.Car.Return = "2031-05-09"
	got, err = Build("T-1", req)
	require.NoError(t, err)
	require.Equal(t, "2031-05-09", got.(PolicyRequest).End, "the return after the check-out ends it")

	req.Car.Pickup = "2031-13-01"
	_, err = Build("T-1", req)
	require.ErrorContains(t, err, "car.pickup")
}

func TestSpecComesFromTheCatalogue(t *testing.T) {
	spec, err := Spec(events.Full(), "http://insurer.example")
	require.NoError(t, err)
	require.Equal(t, "insurance", spec.Name)
	require.Equal(t, events.Compensable, spec.Class)
	require.Equal(t, []string{events.InsuranceBought, events.InsuranceRejected, events.InsuranceFailed, events.InsuranceCanceled},
		[]string{spec.OnDone, spec.OnRejected, spec.OnFailed, spec.OnUndone})
	require.Equal(t, "active", spec.ActiveStatus)
	_, err = Spec(events.Default, "http://insurer.example")
	require.ErrorContains(t, err, `no step "insurance"`, "with the step off there is nothing to run")
}
