// Package insurance is the travel-insurance service: the optional step of
// the trip saga, compensable, on when STEPS names it (between the hotel and
// the payment: STEPS=hotel,insurance,payment,car). On its trigger
// (hotel.held in that order) it buys a policy from the insurer
// (POST /policies, Idempotency-Key "<trip>:insurance") and publishes
// insurance.bought, insurance.rejected (the insurer refused the risk) or
// insurance.failed (unknown at the deadline, canceled by key). Its
// compensation, on the next step's endings (payment.declined,
// payment.failed, payment.refunded), cancels the policy by key and
// publishes insurance.canceled. When the traveler cancels a confirmed trip
// it cancels the policy too (insurance.traveler_canceled). Its triggers,
// events and streams all come from the catalogue (events.Optional);
// everything else is package saga.
package insurance

import (
	"context"
	"fmt"
	"time"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
)

// PolicyRequest is the body of POST /policies (providers.md, Travel
// insurer): the traveler, the trip's first and last days (YYYY-MM-DD) and
// its price in minor units of the ISO 4217 Currency.
type PolicyRequest struct {
	TripID        string        `json:"trip_id"`
	Traveler      events.Person `json:"traveler"`
	Start         string        `json:"start"`
	End           string        `json:"end"`
	TripCostCents int64         `json:"trip_cost_cents"`
	Currency      string        `json:"currency"`
}

// Build returns the policy request of a trip: it covers the stay (check-in
// to check-out) and the car (pickup to return), whichever starts first and
// ends last, and insures the amount the card is charged. The error names a
// date that does not parse (a request the API checked never has one).
func Build(tripID string, t events.TripRequest) (any, error) {
	checkIn, err := time.Parse(time.DateOnly, t.Hotel.CheckIn)
	if err != nil {
		return nil, fmt.Errorf("hotel.check_in: %w", err)
	}
	pickup, err := time.Parse(time.DateOnly, t.Car.Pickup)
	if err != nil {
		return nil, fmt.Errorf("car.pickup: %w", err)
	}
	ret, err := time.Parse(time.DateOnly, t.Car.Return)
	if err != nil {
		return nil, fmt.Errorf("car.return: %w", err)
	}
	start := checkIn
	if pickup.Before(start) {
		start = pickup
	}
	end := checkIn.AddDate(0, 0, t.Hotel.Nights)
	if ret.After(end) {
		end = ret
	}
	return PolicyRequest{
		TripID: tripID, Traveler: t.Traveler, Start: start.Format(time.DateOnly), End: end.Format(time.DateOnly),
		TripCostCents: t.Payment.AmountCents, Currency: t.Payment.Currency,
	}, nil
}

// Spec returns the insurance step of catalogue c calling the insurer at
// baseURL; the error says when c has no insurance step (STEPS lacks it).
func Spec(c events.Catalogue, baseURL string) (saga.Spec, error) {
	return saga.SpecOf(c, "insurance", provider.Insurer(baseURL))
}

// TravelerVoid returns the insurer's part in the traveler's cancellation
// of a confirmed trip: on trip.cancellation_requested, cancel the policy
// "<trip>:insurance" (Idempotency-Key "<trip>:traveler_void" in the step
// log) and publish insurance.traveler_canceled. The insurer keeps no fee:
// providers.md gives it none.
func TravelerVoid(baseURL string) saga.ExtraStep {
	return saga.CancellationStep("traveler_void", "insurance", "insurance", provider.Insurer(baseURL), events.InsuranceTravelerCanceled, false)
}

// Run runs the insurance service process: the step must be in STEPS.
func Run(ctx context.Context, env process.Env) error {
	spec, err := Spec(env.Steps(), env.CompanyURL("insurance"))
	if err != nil {
		return fmt.Errorf("insurance: %w", err)
	}
	return process.RunStep(ctx, env, spec, saga.Builder(Build), "INSURER_URL", TravelerVoid(env.CompanyURL("insurance")))
}
