// Package events defines every event the saga's services exchange: their
// CloudEvents types, their data, the NATS subjects and JetStream streams that
// carry them, the catalogue of saga steps, and the codec that puts a
// CloudEvent on a NATS message in binary content mode.
//
// An event is a CloudEvent (CloudEvents 1.0, github.com/cloudevents/sdk-go/v2
// event model): id is a ULID, source the owning service ("/tripsaga/hotel"),
// subject the trip id, type a reverse-DNS name with a version
// ("io.tripsaga.hotel.held.v1"), data JSON. Its NATS subject is
// "<kind>.<trip>", e.g. "hotel.held.T-01J..."; each owning service has one
// stream (TRIPS, HOTEL, PAYMENT, CAR).
package events

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Event types. The part between "io.tripsaga." and ".v1" is the event's kind ([Kind]),
// which is also the prefix of its NATS subject.
const (
	TripRequested = "io.tripsaga.trip.requested.v1"
	TripConfirmed = "io.tripsaga.trip.confirmed.v1"
	TripCanceled  = "io.tripsaga.trip.canceled.v1"

	HotelHeld     = "io.tripsaga.hotel.held.v1"
	HotelRejected = "io.tripsaga.hotel.rejected.v1" // sold out: final, nothing held
	HotelFailed   = "io.tripsaga.hotel.failed.v1"   // unknown past the deadline, undone by key
	HotelReleased = "io.tripsaga.hotel.released.v1" // compensation done
	// HotelReleaseStuck: the release raised its incident and goes on
	// retrying (see [Compensation.Stuck]).
	HotelReleaseStuck = "io.tripsaga.hotel.release_stuck.v1"

	PaymentCharged  = "io.tripsaga.payment.charged.v1"
	PaymentDeclined = "io.tripsaga.payment.declined.v1"
	PaymentFailed   = "io.tripsaga.payment.failed.v1"
	PaymentRefunded = "io.tripsaga.payment.refunded.v1"
	// PaymentRefundStuck: the refund raised its incident (stuck past its
	// attempt limit, or refused for good) and goes on retrying; the hotel
	// releases on it as on payment.refunded (see [Compensation.Stuck]).
	PaymentRefundStuck = "io.tripsaga.payment.refund_stuck.v1"

	CarBooked   = "io.tripsaga.car.booked.v1"
	CarRejected = "io.tripsaga.car.rejected.v1"
	CarFailed   = "io.tripsaga.car.failed.v1"
	// CarCancelStuck: the booking's cancel by key at its deadline (its
	// outcome still unknown) raised its incident and goes on retrying; the
	// payment is refunded on it as on car.failed (see [Step.Stuck]).
	CarCancelStuck = "io.tripsaga.car.cancel_stuck.v1"
	// CarCanceled: the booking was canceled by key as a compensation, in an
	// order where the car is compensable (charge-last, "hotel,car,payment":
	// the card was declined or its charge failed). Declared only in such an
	// order ([Catalogue.WithSteps]); its stuck event is [CarCancelStuck].
	CarCanceled = "io.tripsaga.car.canceled.v1"

	MailSent = "io.tripsaga.mail.sent.v1"
)

// Streams, one per owning service, plus our own dead-letter stream.
const (
	StreamTrips      = "TRIPS"
	StreamHotel      = "HOTEL"
	StreamPayment    = "PAYMENT"
	StreamCar        = "CAR"
	StreamDeadLetter = "DEADLETTER"
)

// DeadLetterSubjectPrefix starts the subject of every parked message:
// "deadletter.<stream>.<consumer>".
const DeadLetterSubjectPrefix = "deadletter"

// Kind returns the kind of an event type, the two names before its
// version: "hotel.held" of "io.tripsaga.hotel.held.v1". A type is a
// reverse-DNS prefix of its producer's choosing (the trip's is
// "io.tripsaga"; a shop saga's could be "com.example.shop"; CloudEvents
// spec, "type": SHOULD be prefixed with a reverse-DNS name), then
// <entity>.<happening>.v<major>; the kind is also the first two tokens of
// the event's NATS subject. Kind returns "" if typ is not of that shape:
// fewer than four names, an empty one, a name with a character a NATS
// subject token cannot hold ("*", ">", white space), or no v<digits> last.
func Kind(typ string) string {
	names := strings.Split(typ, ".")
	n := len(names)
	if n < 4 {
		return ""
	}
	for _, s := range names {
		if s == "" || strings.ContainsAny(s, "*> \t\r\n") {
			return ""
		}
	}
	v := names[n-1]
	if len(v) < 2 || v[0] != 'v' || strings.Trim(v[1:], "0123456789") != "" {
		return ""
	}
	return names[n-3] + "." + names[n-2]
}

// Subject returns the NATS subject of an event of type typ about trip:
// "<kind>.<trip>".
func Subject(typ, trip string) (string, error) {
	k := Kind(typ)
	if k == "" {
		return "", fmt.Errorf("%w: %q", ErrUnknownType, typ)
	}
	if err := ValidateTripID(trip); err != nil {
		return "", err
	}
	return k + "." + trip, nil
}

// ValidateTripID checks that id can be one NATS subject token: non-empty,
// printable ASCII, no '.', '*', '>' or whitespace.
func ValidateTripID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty trip id", ErrInvalidEvent)
	}
	for _, r := range id {
		if r <= ' ' || r > '~' || r == '.' || r == '*' || r == '>' {
			return fmt.Errorf("%w: trip id %q is not a NATS subject token", ErrInvalidEvent, id)
		}
	}
	return nil
}

// Person is a traveler, guest or driver.
type Person struct {
	Name  string `json:"name"`
	Email string `json:"email"`
}

// HotelRequest is the room part of a trip.
type HotelRequest struct {
	PropertyID string `json:"property_id"`
	CheckIn    string `json:"check_in"` // YYYY-MM-DD
	Nights     int    `json:"nights"`
}

// CarRequest is the car part of a trip.
type CarRequest struct {
	CarClass string `json:"car_class"`
	Pickup   string `json:"pickup"` // YYYY-MM-DD
	Return   string `json:"return"` // YYYY-MM-DD
}

// PaymentRequest is the card part of a trip. Amounts are integer minor
// units of an ISO 4217 currency.
type PaymentRequest struct {
	CardToken   string `json:"card_token"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// TripRequest is the body of POST /trips (trips-api.md).
type TripRequest struct {
	Traveler Person         `json:"traveler"`
	Hotel    HotelRequest   `json:"hotel"`
	Car      CarRequest     `json:"car"`
	Payment  PaymentRequest `json:"payment"`
}

// TripRequestedData is the data of [TripRequested].
type TripRequestedData struct {
	TripID  string      `json:"trip_id"`
	Request TripRequest `json:"request"`
}

// StepData is the data of every step event (held, rejected, failed,
// released, charged, ...). Forward events that trigger the next step carry
// the trip request, so the next service needs nothing else.
type StepData struct {
	TripID         string `json:"trip_id"`
	Step           string `json:"step"`
	IdempotencyKey string `json:"idempotency_key"`
	CompanyRef     string `json:"company_ref,omitempty"` // hold_id, charge_id, booking_id, message_id
	Reason         string `json:"reason,omitempty"`
	// Request is the saga's request as its first event carried it (the
	// trip's: a [TripRequest], as in [TripRequestedData]), on the events
	// that start the next step; the saga machinery carries it as JSON
	// and only each step's build function reads it.
	Request json.RawMessage `json:"request,omitempty"`
	// SettledBy names the operator who settled the step by hand (the
	// operators' action settle: a person did the undo, or the step,
	// outside the system); empty when the company answered.
	SettledBy string `json:"settled_by,omitempty"`
}

// TripSettledData is the data of [TripConfirmed], [TripCanceled] and
// [TripCanceledByTraveler].
type TripSettledData struct {
	TripID   string `json:"trip_id"`
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	Traveler Person `json:"traveler"`
	// FeeCents, RefundCents and Currency are set on
	// [TripCanceledByTraveler] only: the fee kept and the amount refunded,
	// in minor units.
	FeeCents    *int64 `json:"fee_cents,omitempty"`
	RefundCents *int64 `json:"refund_cents,omitempty"`
	Currency    string `json:"currency,omitempty"`
}
