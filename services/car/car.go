// Package car is the car service: the pivot of the trip saga, its last
// step that can fail. On payment.charged it books a car (POST /bookings,
// Idempotency-Key "<trip>:car") and publishes car.booked, car.rejected
// (sold out) or car.failed (unknown at the deadline, canceled by key). Once
// booked, the trip only goes forward: the car has no compensation.
package car

import (
	"context"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/app"
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
func Run(ctx context.Context, env app.Env) error {
	return app.RunStep(ctx, env, Spec(env.CarsURL), Build, "CARS_URL", TravelerCancel(env.CarsURL))
}
