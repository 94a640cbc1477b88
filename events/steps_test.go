package events

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// With the default order, the rewired catalogue is Default itself: with
// the insurance step off nothing changes.
func TestWithStepsDefaultOrderIsDefault(t *testing.T) {
	for _, v := range []string{"", "hotel,payment,car", " hotel , payment,car "} {
		c, err := ParseSteps(v)
		require.NoError(t, err, v)
		require.Equal(t, Default, c, v)
	}
}

func TestWithStepsInsurance(t *testing.T) {
	c, err := ParseSteps("hotel,insurance,payment,car")
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	full := Full()
	require.Equal(t, full.Steps, c.Steps)
	require.Equal(t, full.Projections, c.Projections)
	require.Equal(t, full.Operator, c.Operator)
	require.Subset(t, full.Types, c.Types)
	_, ok := full.Lookup(CarCanceled)
	require.True(t, ok, "Full declares every version's types: car.canceled of charge-last too")

	names := []string{}
	for _, s := range c.Steps {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"hotel", "insurance", "payment", "car", "confirm", "mail", "traveler_release", "traveler_refund", "traveler_cancel", "traveler_settle", "traveler_mail", "traveler_void"}, names)
	settle, _ := c.Step("traveler_settle")
	require.Contains(t, settle.Trigger, InsuranceTravelerCanceled, "the traveler's cancellation waits for the policy too")
	void, _ := c.Step("traveler_void")
	require.Equal(t, []string{TripCancellationRequested}, void.Trigger)
	require.ElementsMatch(t, []string{"hotel", "payment", "car", "insurance"}, func() (out []string) {
		for _, typ := range settle.Trigger {
			et, _ := c.Lookup(typ)
			out = append(out, et.Service)
		}
		return out
	}())
	defaultSettle, _ := Default.Step("traveler_settle")
	require.NotContains(t, defaultSettle.Trigger, InsuranceTravelerCanceled)

	hotel, _ := c.Step("hotel")
	require.Equal(t, []string{TripRequested}, hotel.Trigger)
	require.Equal(t, []string{InsuranceRejected, InsuranceFailed, InsuranceCanceled, InsuranceCancelStuck}, hotel.Compensation.Trigger,
		"the hold is released once the insurance step ended without a policy, its policy is canceled, or its cancel is stuck")
	ins, _ := c.Step("insurance")
	require.Equal(t, []string{HotelHeld}, ins.Trigger)
	require.Equal(t, []string{PaymentDeclined, PaymentFailed, PaymentRefunded, PaymentRefundStuck}, ins.Compensation.Trigger,
		"a stuck refund does not hold up the policy's cancel")
	pay, _ := c.Step("payment")
	require.Equal(t, []string{InsuranceBought}, pay.Trigger, "the payment follows the policy, not the hold")
	require.Equal(t, []string{CarRejected, CarFailed, CarCancelStuck}, pay.Compensation.Trigger,
		"a car's cancel by key stuck at its deadline does not hold up the refund")

	require.Equal(t, []string{"insurance.>"}, c.StreamSubjects()[StreamInsurance])
	require.Subset(t, c.Consumes("insurance"), []string{HotelHeld, PaymentDeclined, PaymentFailed, PaymentRefunded})
	require.Subset(t, c.Consumes("payment"), []string{InsuranceBought, CarRejected, CarFailed})
	require.NotContains(t, c.Consumes("payment"), HotelHeld)
	for _, p := range c.Projections {
		for _, typ := range []string{InsuranceBought, InsuranceRejected, InsuranceFailed, InsuranceCanceled, InsuranceCancelStuck} {
			require.Contains(t, p.Consumes, typ, "projection %s", p.Name)
		}
	}
	require.Contains(t, c.Operator.Consumers, "insurance", "the operators' actions reach the insurance service")
	require.NotContains(t, Default.Operator.Consumers, "insurance")
	require.Contains(t, c.Services(), "insurance")
	require.NotContains(t, Default.Services(), "insurance")
	_, ok = Default.Lookup(InsuranceBought)
	require.False(t, ok, "with the step off its types are not declared (no INSURANCE stream)")
}

// The order may also put the insurance first: the chain follows.
func TestWithStepsInsuranceFirst(t *testing.T) {
	c, err := ParseSteps("insurance,hotel,payment,car")
	require.NoError(t, err)
	ins, _ := c.Step("insurance")
	require.Equal(t, []string{TripRequested}, ins.Trigger)
	require.Equal(t, []string{HotelRejected, HotelFailed, HotelReleased, HotelReleaseStuck}, ins.Compensation.Trigger)
	hotel, _ := c.Step("hotel")
	require.Equal(t, []string{InsuranceBought}, hotel.Trigger)
	require.Equal(t, []string{PaymentDeclined, PaymentFailed, PaymentRefunded, PaymentRefundStuck}, hotel.Compensation.Trigger)
}

func TestWithStepsRefuses(t *testing.T) {
	cases := map[string]string{
		"hotel,payment,car,insurance":  "STEPS=hotel,payment,car,insurance: compensable step insurance comes after the pivot car",
		"hotel,car,payment,insurance":  "STEPS=hotel,car,payment,insurance: compensable step insurance comes after the pivot payment",
		"hotel,insurance":              "step payment is missing",
		"car,payment,hotel":            "compensable step hotel comes after the pivot payment",
		"hotel,insurance,payment":      "step car is missing",
		"hotel,payment,car,spa":        `unknown step "spa"`,
		"hotel,hotel,payment,car":      "step hotel named twice",
		"hotel,insurance,payment,car,": `unknown step ""`,
	}
	for v, want := range cases {
		t.Run(v, func(t *testing.T) {
			_, err := ParseSteps(v)
			require.ErrorIs(t, err, ErrInvalidCatalogue)
			require.ErrorContains(t, err, want)
		})
	}
}

func TestSelectedFollowsSTEPS(t *testing.T) {
	require.Equal(t, Default, Selected())
	t.Setenv(StepsVar, "hotel,insurance,payment,car")
	require.Equal(t, Full().Steps, Selected().Steps)
	t.Setenv(StepsVar, "hotel,payment,car,insurance")
	_, err := FromEnv()
	require.ErrorContains(t, err, "insurance comes after the pivot")
	require.Panics(t, func() { Selected() })
}

// The charge-last order declares the payment the pivot (the last step
// named that can be one) and the car compensable, canceled by key.
func TestWithStepsChargeLast(t *testing.T) {
	c, err := ParseSteps(ChargeLast)
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, ChargeLast, c.Version())

	hotel, _ := c.Step("hotel")
	require.Equal(t, []string{TripRequested}, hotel.Trigger)
	require.Equal(t, []string{CarRejected, CarFailed, CarCanceled, CarCancelStuck}, hotel.Compensation.Trigger,
		"the hold is released once the car ended unbooked, was canceled, or its cancel is stuck")
	car, _ := c.Step("car")
	require.Equal(t, Compensable, car.Class)
	require.Equal(t, []string{HotelHeld}, car.Trigger, "the car follows the hold")
	require.Equal(t, "cancel", car.Compensation.Name)
	require.Equal(t, []string{PaymentDeclined, PaymentFailed, PaymentRefundStuck}, car.Compensation.Trigger,
		"the car is canceled on a declined card, a charge failed at its deadline, or its refund by key stuck")
	require.Equal(t, []string{CarCanceled}, car.Compensation.Publishes)
	require.Equal(t, CarCancelStuck, car.StuckType())
	require.Empty(t, car.Stuck)
	pay, _ := c.Step("payment")
	require.Equal(t, Pivot, pay.Class)
	require.Nil(t, pay.Compensation, "after the pivot only forward: no refund as compensation")
	require.Equal(t, []string{CarBooked}, pay.Trigger, "the card is charged once the car is booked")
	require.Equal(t, PaymentRefundStuck, pay.StuckType())
	confirm, _ := c.Step("confirm")
	require.Equal(t, []string{PaymentCharged}, confirm.Trigger, "confirmed once the pivot is done")

	_, ok := c.Lookup(CarCanceled)
	require.True(t, ok)
	_, ok = c.Lookup(PaymentRefunded)
	require.False(t, ok, "no refund in this order: its type is not declared")
	_, ok = Default.Lookup(CarCanceled)
	require.False(t, ok, "the default order declares no car.canceled")
	for _, p := range c.Projections {
		require.Contains(t, p.Consumes, CarCanceled, "projection %s", p.Name)
		require.NotContains(t, p.Consumes, PaymentRefunded, "projection %s", p.Name)
	}
	require.Equal(t, map[string][]string{
		StreamTrips:    {"trip.cancellation_requested.>", "trip.requested.>"},
		StreamCar:      {"car.cancel_stuck.>", "car.canceled.>", "car.failed.>", "car.rejected.>"},
		StreamOperator: {"operator.action.>"},
	}, c.Streams(c.Consumes("hotel")))

	// With the insurance before the car, the chain follows it.
	ci, err := ParseSteps("hotel,insurance,car,payment")
	require.NoError(t, err)
	car, _ = ci.Step("car")
	require.Equal(t, []string{InsuranceBought}, car.Trigger)
	ins, _ := ci.Step("insurance")
	require.Equal(t, []string{CarRejected, CarFailed, CarCanceled, CarCancelStuck}, ins.Compensation.Trigger)
}

// The pivot is declared by the order: the last step named that can be one.
func TestPivotIsTheLastThatCanBe(t *testing.T) {
	for order, pivot := range map[string]string{
		"hotel,payment,car":           "car",
		"hotel,car,payment":           "payment",
		"payment,hotel,car":           "car",
		"hotel,insurance,car,payment": "payment",
	} {
		c, err := ParseSteps(order)
		require.NoError(t, err, order)
		var got []string
		for _, s := range c.Saga() {
			if s.Class == Pivot {
				got = append(got, s.Name)
			}
		}
		require.Equal(t, []string{pivot}, got, order)
	}
}
