// Package car is the car service. In the default order
// (hotel,payment,car) it is the pivot of the trip saga, its last step
// that can fail: on payment.charged it books a car (POST /bookings,
// Idempotency-Key "<trip>:car") and publishes car.booked, car.rejected
// (sold out) or car.failed (unknown at the deadline, canceled by key);
// once booked, the trip only goes forward, and the car has no
// compensation. In the charge-last order (hotel,car,payment,
// events.ChargeLast) it books on hotel.held and is compensable: on
// payment.declined, payment.failed or payment.refund_stuck it cancels the
// booking by the same key (POST /bookings/{key}/cancel) and publishes
// car.canceled (car.cancel_stuck when the cancel raised its incident and
// goes on retrying). Each trip follows the order it started with.
package car

import (
	"context"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
)

// BookingRequest is the body of POST /bookings (providers.md, Car firm).
type BookingRequest struct {
	TripID   string        `json:"trip_id"`
	CarClass string        `json:"car_class"`
	Pickup   string        `json:"pickup"`
	Return   string        `json:"return"`
	Driver   events.Person `json:"driver"`
}

// Build returns the booking request of a trip.
func Build(tripID string, t events.TripRequest) (any, error) {
	return BookingRequest{TripID: tripID, CarClass: t.Car.CarClass, Pickup: t.Car.Pickup, Return: t.Car.Return, Driver: t.Traveler}, nil
}

// Spec returns the car step calling the car firm at baseURL.
func Spec(baseURL string) saga.Spec {
	c := provider.Cars(baseURL)
	return saga.Spec{
		Name: "car", Service: "car", Class: events.Pivot, Company: c, ActiveStatus: c.ActiveStatus,
		OnDone: events.CarBooked, OnRejected: events.CarRejected, OnFailed: events.CarFailed,
		// Its undo in an order where it is compensable (charge-last).
		OnUndone: events.CarCanceled,
	}
}

// TravelerCancel returns the car firm's part in the traveler's
// cancellation of a confirmed trip: on trip.cancellation_requested, cancel
// the booking "<trip>:car" (Idempotency-Key "<trip>:traveler_cancel" in
// the step log) and publish car.traveler_canceled. The car firm charges no
// fee of its own: providers.md gives it none.
func TravelerCancel(baseURL string) saga.ExtraStep {
	return saga.CancellationStep("traveler_cancel", "car", "car", provider.Cars(baseURL), events.CarTravelerCanceled, false)
}

// Run runs the car service process.
func Run(ctx context.Context, env process.Env) error {
	return process.RunStep(ctx, env, Spec(env.CompanyURL("car")), saga.Builder(Build), "CARS_URL", TravelerCancel(env.CompanyURL("car")))
}
