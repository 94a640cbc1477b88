package reconciler

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/provider"
)

// TestStatusOfATravelerCancellation: a confirmed trip the traveler cancels
// is canceling_by_traveler (not settled: a cancellation that never ends is
// found stuck) until trip.canceled_by_traveler settles it, in any order.
func TestStatusOfATravelerCancellation(t *testing.T) {
	booked := []string{"trip.requested", "hotel.held", "payment.charged", "car.booked", "trip.confirmed"}
	st, settled := Status(events.Selected(), append(booked, "trip.cancellation_requested", "hotel.traveler_released"))
	require.Equal(t, []string{"canceling_by_traveler", ""}, []string{st, settled})
	st, settled = Status(events.Selected(), []string{"trip.canceled_by_traveler", "trip.confirmed"})
	require.Equal(t, []string{"canceled_by_traveler", "canceled_by_traveler"}, []string{st, settled})
}

// TestTravelerHalf: a trip canceled by the traveler is half when a hold, a
// booking or an unrefunded remainder is left, or another amount was
// refunded than the charge minus the fee.
func TestTravelerHalf(t *testing.T) {
	r := &Reconciler{cfg: Config{Companies: map[string]*provider.Client{
		"hotel": provider.Hotel(""), "payment": provider.Payments(""), "car": provider.Cars(""),
	}, RefundStep: "payment"}}
	recs := func(hold, charge, booking string, refunded int64) *companyRecords {
		return &companyRecords{by: map[string]map[string]int{
			"hotel": {hold: 1}, "payment": {charge: 1}, "car": {booking: 1},
		}, refunded: refunded}
	}
	for _, tc := range []struct {
		name   string
		c      *companyRecords
		refund int64
		half   string
	}{
		{"all undone, refunded exactly", recs("released", "refunded", "canceled", 24751), 24751, ""},
		{"the fee is the whole charge: left charged", recs("released", "charged", "canceled", 0), 0, ""},
		{"a hold left", recs("held", "refunded", "canceled", 24751), 24751, "a hold is still held"},
		{"a booking left", recs("released", "refunded", "booked", 24751), 24751, "a booking is still booked"},
		{"an unrefunded remainder", recs("released", "charged", "canceled", 0), 24751, "the charge is not refunded (24751 due)"},
		{"refunded whole instead of the remainder", recs("released", "refunded", "canceled", 33001), 24751, "33001 refunded, not the 24751 due"},
		{"refunded although the fee is the whole charge", recs("released", "refunded", "canceled", 100), 0, "100 refunded, not the 0 due"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.half, r.travelerHalf(tc.c, tc.refund))
		})
	}
}
