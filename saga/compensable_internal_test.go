package saga

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
)

// The car's runner (a pivot Spec naming its undo's event) undoes a trip
// only when the trip's own order makes the car compensable: a
// charge-last trip, never a default one, whose car is the pivot.
func TestCompensableByTheTripsOrder(t *testing.T) {
	car := &Runner{cfg: Config{Spec: Spec{Name: "car", Class: events.Pivot, OnUndone: events.CarCanceled}, Family: events.TripVersions()}}
	require.True(t, car.compensableIn(events.ChargeLast))
	require.True(t, car.compensableIn("hotel,insurance,car,payment"))
	require.False(t, car.compensableIn(""), "a trip of before versions is of the default order")
	require.False(t, car.compensableIn("hotel,payment,car"))
	require.False(t, car.compensableIn("hotel,car"), "an invalid version undoes nothing")

	noFamily := &Runner{cfg: Config{Spec: Spec{Name: "car", Class: events.Pivot, OnUndone: events.CarCanceled}}}
	require.False(t, noFamily.compensableIn(events.ChargeLast), "without the saga's versions a pivot is never undone")

	noUndo := &Runner{cfg: Config{Spec: Spec{Name: "car", Class: events.Pivot}, Family: events.TripVersions()}}
	require.False(t, noUndo.compensableIn(events.ChargeLast), "a Spec without its undo's event cannot undo")

	mail := &Runner{cfg: Config{Spec: Spec{Name: "mail", Class: events.ForwardOnly, OnUndone: events.MailSent}}}
	require.False(t, mail.compensableIn(events.ChargeLast))

	hotel := &Runner{cfg: Config{Spec: Spec{Name: "hotel", Class: events.Compensable, OnUndone: events.HotelReleased}}}
	require.True(t, hotel.compensableIn(""))
	require.True(t, hotel.compensableIn(events.ChargeLast))
}
