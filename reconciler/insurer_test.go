package reconciler

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/provider"
)

// With the insurance step on, a settled trip is whole only when the
// insurer agrees too: one policy active for a confirmed trip, none for a
// canceled one.
func TestSweepWithInsurance(t *testing.T) {
	t.Setenv(events.StepsVar, "hotel,insurance,payment,car")
	b := setup(t, func(c *Config) {
		hotel := c.Companies["hotel"].BaseURL
		c.Companies["insurance"] = provider.Insurer(hotel[:len(hotel)-len("/hotel")] + "/insurer")
	})
	b.start(t)
	insurer := b.r.cfg.Companies["insurance"]
	insure := func(trip string) {
		r, err := insurer.Create(context.Background(), trip+":insurance", map[string]any{
			"trip_id": trip, "traveler": map[string]string{"name": "Ada Example", "email": "ada@example.com"},
			"start": "2026-12-18", "end": "2026-12-20", "trip_cost_cents": 33000, "currency": "USD",
		})
		require.NoError(t, err)
		require.Equal(t, provider.Done, r.Outcome)
	}
	confirmed := []string{events.TripRequested, events.HotelHeld, events.InsuranceBought, events.PaymentCharged, events.CarBooked, events.TripConfirmed}

	// Whole: one of each, the policy included.
	b.hold(t, "T-whole")
	insure("T-whole")
	b.charge(t, "T-whole")
	b.book(t, "T-whole")
	b.publishAll(t, "T-whole", confirmed...)
	// Confirmed by events, but the insurer has no policy.
	b.hold(t, "T-nopolicy")
	b.charge(t, "T-nopolicy")
	b.book(t, "T-nopolicy")
	b.publishAll(t, "T-nopolicy", confirmed...)
	// Canceled by events (card declined), but the policy is still active.
	b.hold(t, "T-left")
	insure("T-left")
	_, err := provider.Hotel(b.companies+"/hotel").Undo(context.Background(), "T-left:hotel")
	require.NoError(t, err)
	b.publishAll(t, "T-left", events.TripRequested, events.HotelHeld, events.InsuranceBought, events.PaymentDeclined,
		events.InsuranceCanceled, events.HotelReleased, events.TripCanceled)
	// The insurer rejected: the hold released, nothing else: whole.
	b.hold(t, "T-rejected")
	_, err = provider.Hotel(b.companies+"/hotel").Undo(context.Background(), "T-rejected:hotel")
	require.NoError(t, err)
	b.publishAll(t, "T-rejected", events.TripRequested, events.HotelHeld, events.InsuranceRejected, events.HotelReleased, events.TripCanceled)
	// Trips of the version without insurance (started before STEPS
	// turned it on) are judged by their own steps: whole with no policy,
	// half with one (a policy the saga never asked for).
	plain := events.Default.Version()
	plainConfirmed := []string{events.TripRequested, events.HotelHeld, events.PaymentCharged, events.CarBooked, events.TripConfirmed}
	for _, trip := range []string{"T-plain", "T-plainpolicy"} {
		b.hold(t, trip)
		b.charge(t, trip)
		b.book(t, trip)
		b.publishAllOf(t, plain, trip, plainConfirmed...)
	}
	insure("T-plainpolicy")
	testenv.Eventually(t, b.caughtUp, "projection caught up")

	res := b.sweep(t)
	open := b.open(t)
	require.Equal(t, 3, res.Open[FindingHalf], "%v", open)
	require.Contains(t, open["T-plainpolicy/half"].Detail, "policies active 1")
	require.NotContains(t, open, "T-plain/half", "a trip of a version without insurance needs no policy")
	pv, ok := b.viewOf(t, "T-plain")
	require.True(t, ok)
	require.Equal(t, plain, pv.Version, "the view shows the trip's version")
	require.Contains(t, open["T-nopolicy/half"].Detail, "policies none")
	require.Contains(t, open["T-left/half"].Detail, "policies active 1")
	v, ok := b.viewOf(t, "T-left")
	require.True(t, ok)
	require.Contains(t, v.Seen, "insurance.canceled", "the projection follows the INSURANCE stream")

	wv, ok := b.viewOf(t, "T-whole")
	require.True(t, ok)
	require.Equal(t, "hotel,insurance,payment,car", wv.Version)

	_, err = insurer.Undo(context.Background(), "T-left:insurance")
	require.NoError(t, err)
	res = b.sweep(t)
	require.Equal(t, 1, res.Resolved)
	require.Contains(t, b.open(t), "T-nopolicy/half")
}

// A trip canceled by the traveler leaves no policy in force either.
func TestTravelerHalfWithAPolicy(t *testing.T) {
	r := &Reconciler{cfg: Config{Companies: map[string]*provider.Client{
		"hotel": provider.Hotel(""), "payment": provider.Payments(""), "car": provider.Cars(""), "insurance": provider.Insurer(""),
	}, RefundStep: "payment"}}
	c := &companyRecords{
		by: map[string]map[string]int{
			"hotel": {"released": 1}, "payment": {"refunded": 1}, "car": {"canceled": 1}, "insurance": {"active": 1},
		}, refunded: 24751,
	}
	require.Equal(t, "a policy is still active", r.travelerHalf(c, 24751))
	c.by["insurance"] = map[string]int{"canceled": 1}
	require.Empty(t, r.travelerHalf(c, 24751))
}
