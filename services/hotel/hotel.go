// Package hotel is the hotel service: the first step of the trip saga
// (compensable). On trip.requested it holds a room with the hotel
// (POST /holds, Idempotency-Key "<trip>:hotel") and publishes hotel.held,
// hotel.rejected (sold out) or hotel.failed (unknown at the deadline, released
// by key). Its compensation, on payment.declined, payment.failed or
// payment.refunded, releases the hold by key and publishes hotel.released.
package hotel

import (
	"context"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
)

// HoldRequest is the body of POST /holds (providers.md, Hotel).
type HoldRequest struct {
	TripID     string        `json:"trip_id"`
	PropertyID string        `json:"property_id"`
	CheckIn    string        `json:"check_in"`
	Nights     int           `json:"nights"`
	Guest      events.Person `json:"guest"`
}

// Build returns the hold request of a trip.
func Build(tripID string, t events.TripRequest) (any, error) {
	return HoldRequest{TripID: tripID, PropertyID: t.Hotel.PropertyID, CheckIn: t.Hotel.CheckIn, Nights: t.Hotel.Nights, Guest: t.Traveler}, nil
}

// Spec returns the hotel step calling the hotel at baseURL.
func Spec(baseURL string) saga.Spec {
	c := provider.Hotel(baseURL)
	return saga.Spec{
		Name: "hotel", Service: "hotel", Class: events.Compensable, Company: c, ActiveStatus: c.ActiveStatus,
		OnDone: events.HotelHeld, OnRejected: events.HotelRejected, OnFailed: events.HotelFailed, OnUndone: events.HotelReleased,
	}
}

// TravelerRelease returns the hotel's part in the traveler's cancellation
// of a confirmed trip: on trip.cancellation_requested, release the hold
// "<trip>:hotel" (Idempotency-Key "<trip>:traveler_release" in the step
// log) and publish hotel.traveler_released. The hotel charges no fee of its
// own: providers.md gives it none.
func TravelerRelease(baseURL string) saga.ExtraStep {
	return saga.CancellationStep("traveler_release", "hotel", "hotel", provider.Hotel(baseURL), events.HotelTravelerReleased, false)
}

// Run runs the hotel service process.
func Run(ctx context.Context, env process.Env) error {
	return process.RunStep(ctx, env, Spec(env.CompanyURL("hotel")), saga.Builder(Build), "HOTEL_URL", TravelerRelease(env.CompanyURL("hotel")))
}
