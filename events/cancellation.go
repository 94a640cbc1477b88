package events

import "time"

// The traveler's cancellation of a confirmed trip (issue 11): a saga of its
// own, after the pivot, so every step of it is forward-only (retried until
// done, never undone). trips publishes trip.cancellation_requested when a
// traveler cancels a confirmed trip; the hotel releases the hold, the car
// firm cancels the booking and the card processor refunds the charge minus
// the fee, each by the booking step's key and under an Idempotency-Key of
// its own ("<trip>:traveler_release", "<trip>:traveler_cancel",
// "<trip>:traveler_refund"); once all three are done trips publishes
// trip.canceled_by_traveler and emails the traveler.
const (
	TripCancellationRequested = "io.tripsaga.trip.cancellation_requested.v1"
	TripCanceledByTraveler    = "io.tripsaga.trip.canceled_by_traveler.v1"

	HotelTravelerReleased   = "io.tripsaga.hotel.traveler_released.v1"
	PaymentTravelerRefunded = "io.tripsaga.payment.traveler_refunded.v1"
	CarTravelerCanceled     = "io.tripsaga.car.traveler_canceled.v1"
)

// CancellationData is the data of [TripCancellationRequested]: the trip as
// booked and the fee the policy kept. Amounts are integer minor units of
// Currency; FeeCents + RefundCents == ChargedCents, and neither is
// negative.
type CancellationData struct {
	TripID       string      `json:"trip_id"`
	Request      TripRequest `json:"request"`
	ChargedCents int64       `json:"charged_cents"`
	FeeCents     int64       `json:"fee_cents"`
	RefundCents  int64       `json:"refund_cents"`
	Currency     string      `json:"currency"`
	// Band names the fee band that applied ("free", "inside 7 days", ...).
	Band        string    `json:"band"`
	RequestedAt time.Time `json:"requested_at"`
}
