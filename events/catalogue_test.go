package events

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDefaultCatalogueIsValid(t *testing.T) {
	require.NoError(t, Default.Validate())
}

func TestCatalogueRejects(t *testing.T) {
	clone := func() Catalogue {
		c := Default
		c.Types = append([]EventType(nil), Default.Types...)
		c.Steps = nil
		for _, s := range Default.Steps {
			s2 := s
			if s.Compensation != nil {
				comp := *s.Compensation
				s2.Compensation = &comp
			}
			c.Steps = append(c.Steps, s2)
		}
		c.Projections = append([]Projection(nil), Default.Projections...)
		return c
	}
	cases := map[string]struct {
		mutate func(*Catalogue)
		want   string
	}{
		"CompensableWithoutCompensation": {func(c *Catalogue) { c.Steps[0].Compensation = nil }, "compensable step hotel has no compensation"},
		"StepAfterPivotNotForwardOnly": {func(c *Catalogue) {
			c.Steps[3].Class = Compensable
			c.Steps[3].Compensation = &Compensation{Name: "x", Trigger: []string{CarBooked}}
		}, "after the pivot is compensable"},
		"PivotWithCompensation": {func(c *Catalogue) {
			c.Steps[2].Compensation = &Compensation{Name: "cancel", Trigger: []string{MailSent}}
		}, "pivot car has a compensation"},
		"NoPivot": {func(c *Catalogue) { c.Steps[2].Class = Compensable; c.Steps[2].Compensation = &Compensation{Name: "c"} }, "no pivot step"},
		"UndeclaredPublished": {func(c *Catalogue) {
			c.Steps[0].Publishes = append(c.Steps[0].Publishes, "io.tripsaga.hotel.upgraded.v1")
		}, `undeclared type "io.tripsaga.hotel.upgraded.v1"`},
		"PublishedWithoutConsumer": {func(c *Catalogue) {
			c.Projections = c.Projections[:1] // drop the reconciler: mail.sent has no consumer left
		}, `"io.tripsaga.mail.sent.v1" is published but has no consumer`},
		"DeclaredNeverPublished": {func(c *Catalogue) {
			c.Types = append(c.Types, EventType{Type: "io.tripsaga.car.upgraded.v1", Stream: StreamCar})
			c.Projections[1].Consumes = append(c.Projections[1].Consumes, "io.tripsaga.car.upgraded.v1")
		}, "no step publishes it"},
		"CompensableWithItsOwnStuck": {func(c *Catalogue) { c.Steps[1].Stuck = CarCancelStuck }, "step payment is compensable and declares its own stuck event"},
		"PivotStuckUndeclared":       {func(c *Catalogue) { c.Steps[2].Stuck = "io.tripsaga.car.lost.v1" }, `undeclared type "io.tripsaga.car.lost.v1"`},
		"BadTypeName":                {func(c *Catalogue) { c.Types = append(c.Types, EventType{Type: "car.upgraded"}) }, "is not <reverse-DNS prefix>.<entity>.<happening>.v<N>"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := clone()
			tc.mutate(&c)
			err := c.Validate()
			require.ErrorIs(t, err, ErrInvalidCatalogue)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestConsumesAndStreams(t *testing.T) {
	require.ElementsMatch(t, []string{TripRequested, PaymentDeclined, PaymentFailed, PaymentRefunded, PaymentRefundStuck, OperatorAction, TripCancellationRequested}, Default.Consumes("hotel"),
		"the hotel releases on a stuck refund too: one stuck undo does not hold up the others")
	require.Equal(t, map[string][]string{
		StreamTrips:    {"trip.cancellation_requested.>", "trip.requested.>"},
		StreamPayment:  {"payment.declined.>", "payment.failed.>", "payment.refund_stuck.>", "payment.refunded.>"},
		StreamOperator: {"operator.action.>"},
	}, Default.Streams(Default.Consumes("hotel")))
	require.Contains(t, Default.Consumes("trips"), OperatorAction, "trips carries out re-drives and its mail steps' retries")
	require.Equal(t, []string{"operator.>"}, Default.StreamSubjects()[StreamOperator])
	require.Equal(t, []string{"trip.>", "mail.>"}, Default.StreamSubjects()[StreamTrips])
}

func TestPublishes(t *testing.T) {
	require.ElementsMatch(t, []string{HotelHeld, HotelRejected, HotelFailed, HotelReleased, HotelReleaseStuck, HotelTravelerReleased}, Default.Publishes("hotel"))
	require.ElementsMatch(t, []string{OperatorAction}, Default.Publishes("reconciler"))
	require.ElementsMatch(t, []string{TripRequested, TripConfirmed, TripCanceled, MailSent, TripCancellationRequested, TripCanceledByTraveler}, Default.Publishes("trips"))
}

// TestKindOfAnyReverseDNSPrefix: the kind of a type is the two names
// before its version, whatever the producer's reverse-DNS prefix (the
// trip's io.tripsaga, a shop's com.example.shop), so another saga's types
// get subjects without being named io.tripsaga; a type of another shape
// has none.
func TestKindOfAnyReverseDNSPrefix(t *testing.T) {
	for typ, want := range map[string]string{
		"io.tripsaga.hotel.held.v1":                  "hotel.held",
		"io.tripsaga.trip.cancellation_requested.v1": "trip.cancellation_requested",
		"com.example.shop.stock.reserved.v2":         "stock.reserved",
		"shop.parcel.handed_over.v10":                "parcel.handed_over",
		"car.upgraded":                               "",
		"io.tripsaga.hotel.held":                     "",
		"hotel.held.v1":                              "",
		"io.tripsaga.hotel..v1":                      "",
		"io.tripsaga.hotel.held.v":                   "",
		"io.tripsaga.hotel.held.vx":                  "",
		"io.tripsaga.hotel.*.v1":                     "",
		"io.tripsaga.hotel.held >.v1":                "",
		"":                                           "",
	} {
		if got := Kind(typ); got != want {
			t.Errorf("Kind(%q) = %q, want %q", typ, got, want)
		}
	}
}
