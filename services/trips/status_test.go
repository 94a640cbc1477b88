package trips

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestProject(t *testing.T) {
	cases := []struct {
		seen []string
		want string
	}{
		{nil, StatusPending},
		{[]string{"hotel.held", "payment.charged"}, StatusPending},
		{[]string{"hotel.held", "payment.charged", "car.booked"}, StatusConfirmed},
		{[]string{"car.booked"}, StatusConfirmed},
		{[]string{"hotel.rejected"}, StatusCanceled},
		{[]string{"hotel.failed"}, StatusCanceled},
		{[]string{"hotel.held", "payment.declined"}, StatusCanceling},
		{[]string{"payment.declined"}, StatusCanceling},
		{[]string{"payment.declined", "hotel.released"}, StatusCanceled},
		{[]string{"hotel.held", "payment.charged", "car.rejected"}, StatusCanceling},
		{[]string{"car.rejected", "hotel.released"}, StatusCanceling},
		{[]string{"car.rejected", "payment.refunded"}, StatusCanceling},
		{[]string{"car.failed", "payment.refunded", "hotel.released"}, StatusCanceled},
		{[]string{"hotel.held", "payment.failed", "hotel.released"}, StatusCanceled},
	}
	for _, c := range cases {
		require.Equal(t, c.want, Project(c.seen), "%v", c.seen)
	}
}

func TestProjectIgnoresArrivalOrder(t *testing.T) {
	full := []string{"hotel.held", "payment.charged", "car.rejected", "payment.refunded", "hotel.released"}
	for range 200 {
		s := append([]string(nil), full...)
		rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
		require.Equal(t, StatusCanceled, Project(s))
		// Any prefix of a shuffled order is never final-confirmed, and only
		// canceled once both undos are in.
		for i := range s {
			st := Project(s[:i])
			require.NotEqual(t, StatusConfirmed, st)
		}
	}
}

func TestSteps(t *testing.T) {
	require.Equal(t, map[string]string{"hotel": "released", "payment": "declined", "car": "skipped"},
		Steps([]string{"hotel.held", "payment.declined", "hotel.released"}, StatusCanceled))
	require.Equal(t, map[string]string{"hotel": "held", "payment": "pending", "car": "pending"},
		Steps([]string{"hotel.held"}, StatusPending))
}
