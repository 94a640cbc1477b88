// Package payment is the payment service: the second step of the trip saga
// (compensable). On hotel.held it charges the card (POST /charges,
// Idempotency-Key "<trip>:charge") and publishes payment.charged,
// payment.declined or payment.failed (unknown at the deadline, refunded by
// key). Its compensation, on car.rejected or car.failed, refunds by key and
// publishes payment.refunded; a refund is a second statement line, never a
// deleted charge.
package payment

import (
	"context"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
)

// ChargeRequest is the body of POST /charges (providers.md, Card
// processor). AmountCents is in minor units of the ISO 4217 Currency.
type ChargeRequest struct {
	TripID      string `json:"trip_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	CardToken   string `json:"card_token"`
}

// Build returns the charge request of a trip.
func Build(tripID string, t events.TripRequest) (any, error) {
	return ChargeRequest{TripID: tripID, AmountCents: t.Payment.AmountCents, Currency: t.Payment.Currency, CardToken: t.Payment.CardToken}, nil
}

// Spec returns the payment step calling the card processor at baseURL.
func Spec(baseURL string) saga.Spec {
	c := provider.Payments(baseURL)
	return saga.Spec{
		Name: "payment", KeyName: "charge", Service: "payment", Class: events.Compensable, Company: c, ActiveStatus: c.ActiveStatus,
		RejectedStatus: c.RejectedStatus, RejectedReason: c.RejectedReason,
		OnDone: events.PaymentCharged, OnRejected: events.PaymentDeclined, OnFailed: events.PaymentFailed, OnUndone: events.PaymentRefunded,
	}
}

// TravelerRefund returns the payment's part in the traveler's
// cancellation of a confirmed trip: on trip.cancellation_requested, refund
// the charge "<trip>:charge" in part, the charge minus the fee
// (POST /charges/{key}/refund {"amount_cents"}, providers.md; no call when
// the fee is the whole charge), under the Idempotency-Key
// "<trip>:traveler_refund" in the step log, and publish
// payment.traveler_refunded.
func TravelerRefund(baseURL string) saga.ExtraStep {
	return saga.CancellationStep("traveler_refund", "payment", "charge", provider.Payments(baseURL), events.PaymentTravelerRefunded, true)
}

// Run runs the payment service process.
func Run(ctx context.Context, env process.Env) error {
	return process.RunStep(ctx, env, Spec(env.CompanyURL("payment")), saga.Builder(Build), "PAYMENTS_URL", TravelerRefund(env.CompanyURL("payment")))
}
