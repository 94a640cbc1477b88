package trips

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
)

// A refund that raised its incident (payment.refund_stuck) does not hold
// up the hotel's release: the trip stays canceling with the refund named
// open, and settles canceled once the refund is done.
func TestProjectWithAStuckUndo(t *testing.T) {
	cases := []struct {
		seen []string
		want string
		open []string
	}{
		{[]string{"hotel.held", "payment.charged", "car.rejected", "payment.refund_stuck"}, StatusCanceling, []string{"payment"}},
		{[]string{"hotel.held", "payment.charged", "car.rejected", "payment.refund_stuck", "hotel.released"}, StatusCanceling, []string{"payment"}},
		{[]string{"payment.refund_stuck"}, StatusCanceling, []string{"payment"}},
		{[]string{"payment.refund_stuck", "hotel.released"}, StatusCanceling, []string{"payment"}},
		{[]string{"payment.refund_stuck", "hotel.released", "payment.refunded"}, StatusCanceled, nil},
		{[]string{"payment.refund_stuck", "payment.refunded"}, StatusCanceling, nil},
		// An unknown charge whose undo by key at its deadline got stuck:
		// the release goes on, payment.failed closes it.
		{[]string{"hotel.held", "payment.refund_stuck", "hotel.released"}, StatusCanceling, []string{"payment"}},
		{[]string{"hotel.held", "payment.refund_stuck", "hotel.released", "payment.failed"}, StatusCanceled, nil},
		// The first step's undo stuck, and both stuck.
		{[]string{"hotel.held", "payment.declined", "hotel.release_stuck"}, StatusCanceling, []string{"hotel"}},
		{[]string{"car.rejected", "payment.refund_stuck", "hotel.release_stuck"}, StatusCanceling, []string{"payment", "hotel"}},
		{[]string{"car.rejected", "payment.refund_stuck", "hotel.release_stuck", "payment.refunded", "hotel.released"}, StatusCanceled, nil},
	}
	for _, c := range cases {
		require.Equal(t, c.want, Project(events.Selected(), c.seen), "%v", c.seen)
		require.Equal(t, c.open, OpenUndos(events.Selected(), c.seen), "%v", c.seen)
	}
	require.Equal(t, map[string]string{"hotel": "released", "payment": "refund_stuck", "car": "sold_out"},
		Steps(events.Selected(), []string{"hotel.held", "payment.charged", "car.rejected", "payment.refund_stuck", "hotel.released"}, StatusCanceling))
	require.Equal(t, map[string]string{"hotel": "released", "payment": "refunded", "car": "sold_out"},
		Steps(events.Selected(), []string{"hotel.held", "payment.charged", "car.rejected", "payment.refund_stuck", "hotel.released", "payment.refunded"}, StatusCanceled))
}

// In any arrival order, and at every prefix of it, a trip with a stuck
// refund is canceled only with both undos in, and names the refund open
// exactly while its stuck event is in and its refund is not.
func TestProjectWithAStuckUndoIgnoresArrivalOrder(t *testing.T) {
	full := []string{"hotel.held", "payment.charged", "car.rejected", "payment.refund_stuck", "hotel.released", "payment.refunded"}
	for range 300 {
		s := slices.Clone(full)
		rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
		require.Equal(t, StatusCanceled, Project(events.Selected(), s), "%v", s)
		for i := range s {
			p := s[:i]
			st, open := Project(events.Selected(), p), OpenUndos(events.Selected(), p)
			require.NotEqual(t, StatusConfirmed, st, "%v", p)
			if st == StatusCanceled {
				require.Subset(t, p, []string{"payment.refunded", "hotel.released"}, "%v", p)
			}
			wantOpen := slices.Contains(p, "payment.refund_stuck") && !slices.Contains(p, "payment.refunded")
			require.Equal(t, wantOpen, slices.Equal(open, []string{"payment"}), "%v: %v", p, open)
			if wantOpen {
				require.Equal(t, StatusCanceling, st)
			}
		}
	}
}

// With four steps a stuck refund lets the policy's cancel and the
// release go on, and a stuck cancel of the policy lets the release go on.
func TestProjectWithAStuckUndoAndInsurance(t *testing.T) {
	t.Setenv(events.StepsVar, "hotel,insurance,payment,car")
	seen := []string{"hotel.held", "insurance.bought", "payment.charged", "car.rejected", "payment.refund_stuck", "insurance.canceled", "hotel.released"}
	require.Equal(t, StatusCanceling, Project(events.Selected(), seen))
	require.Equal(t, []string{"payment"}, OpenUndos(events.Selected(), seen))
	require.Equal(t, StatusCanceled, Project(events.Selected(), append(seen, "payment.refunded")))
	seen = []string{"hotel.held", "insurance.bought", "payment.declined", "insurance.cancel_stuck", "hotel.released"}
	require.Equal(t, StatusCanceling, Project(events.Selected(), seen))
	require.Equal(t, []string{"insurance"}, OpenUndos(events.Selected(), seen))
	require.Equal(t, "cancel_stuck", Steps(events.Selected(), seen, StatusCanceling)["insurance"])
	require.Equal(t, StatusCanceled, Project(events.Selected(), append(seen, "insurance.canceled")))
}

// The car's cancel by key at its deadline (its booking's outcome still
// unknown) stuck: car.cancel_stuck lets the refund and the release go on,
// in any arrival order, while the trip stays canceling with the car open
// until car.failed (the cancel done, by the car firm or an operator's
// settle).
func TestProjectWithTheCarsCancelStuck(t *testing.T) {
	full := []string{"hotel.held", "payment.charged", "car.cancel_stuck", "payment.refunded", "hotel.released", "car.failed"}
	for range 300 {
		s := slices.Clone(full)
		rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
		require.Equal(t, StatusCanceled, Project(events.Selected(), s), "%v", s)
		require.Empty(t, OpenUndos(events.Selected(), s), "%v", s)
		for i := range s {
			p := s[:i]
			st, open := Project(events.Selected(), p), OpenUndos(events.Selected(), p)
			require.NotEqual(t, StatusConfirmed, st, "%v", p)
			if st == StatusCanceled {
				require.Subset(t, p, []string{"car.failed", "payment.refunded", "hotel.released"}, "%v", p)
			}
			wantOpen := slices.Contains(p, "car.cancel_stuck") && !slices.Contains(p, "car.failed")
			require.Equal(t, wantOpen, slices.Contains(open, "car"), "%v: %v", p, open)
			if wantOpen {
				require.Equal(t, StatusCanceling, st, "%v", p)
				require.Equal(t, "cancel_stuck", Steps(events.Selected(), p, st)["car"], "%v", p)
			}
		}
	}
	// Both the car's cancel and the refund stuck: both open, newest first.
	seen := []string{"hotel.held", "payment.charged", "car.cancel_stuck", "payment.refund_stuck", "hotel.released"}
	require.Equal(t, StatusCanceling, Project(events.Selected(), seen))
	require.Equal(t, []string{"car", "payment"}, OpenUndos(events.Selected(), seen))
}
