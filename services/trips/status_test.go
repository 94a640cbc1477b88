package trips

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/services/trips/internal/dbsqlc"
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
		require.Equal(t, c.want, Project(events.Selected(), c.seen), "%v", c.seen)
	}
}

func TestProjectIgnoresArrivalOrder(t *testing.T) {
	full := []string{"hotel.held", "payment.charged", "car.rejected", "payment.refunded", "hotel.released"}
	for range 200 {
		s := append([]string(nil), full...)
		rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
		require.Equal(t, StatusCanceled, Project(events.Selected(), s))
		// Any prefix of a shuffled order is never final-confirmed, and only
		// canceled once both undos are in.
		for i := range s {
			st := Project(events.Selected(), s[:i])
			require.NotEqual(t, StatusConfirmed, st)
		}
	}
}

func TestSteps(t *testing.T) {
	require.Equal(t, map[string]string{"hotel": "released", "payment": "declined", "car": "skipped"},
		Steps(events.Selected(), []string{"hotel.held", "payment.declined", "hotel.released"}, StatusCanceled))
	require.Equal(t, map[string]string{"hotel": "held", "payment": "pending", "car": "pending"},
		Steps(events.Selected(), []string{"hotel.held"}, StatusPending))
}

// A charge-last trip (hotel,car,payment) is projected by its own order:
// confirmed once the payment (its pivot) is charged, not on car.booked;
// canceled once the car is canceled and the hold released; the car's
// stuck cancel named open while the hold is released.
func TestProjectChargeLast(t *testing.T) {
	const v = "hotel,car,payment"
	cases := []struct {
		seen []string
		want string
		open []string
	}{
		{[]string{"hotel.held", "car.booked"}, StatusPending, nil},
		{[]string{"hotel.held", "car.booked", "payment.charged"}, StatusConfirmed, nil},
		{[]string{"hotel.held", "car.rejected"}, StatusCanceling, nil},
		{[]string{"hotel.held", "car.rejected", "hotel.released"}, StatusCanceled, nil},
		{[]string{"hotel.held", "car.booked", "payment.declined"}, StatusCanceling, nil},
		{[]string{"hotel.held", "car.booked", "payment.declined", "hotel.released"}, StatusCanceling, nil},
		{[]string{"hotel.held", "car.booked", "payment.declined", "car.canceled", "hotel.released"}, StatusCanceled, nil},
		{[]string{"hotel.held", "car.booked", "payment.declined", "car.cancel_stuck", "hotel.released"}, StatusCanceling, []string{"car"}},
		{[]string{"hotel.held", "car.booked", "payment.failed", "car.canceled", "hotel.released"}, StatusCanceled, nil},
		{[]string{"hotel.held", "car.booked", "payment.refund_stuck", "car.canceled", "hotel.released"}, StatusCanceling, []string{"payment"}},
		{[]string{"hotel.held", "car.booked", "payment.refund_stuck", "payment.failed", "car.canceled", "hotel.released"}, StatusCanceled, nil},
	}
	for _, c := range cases {
		require.Equal(t, c.want, ProjectOf(v, c.seen), "%v", c.seen)
		require.Equal(t, c.open, OpenUndosOf(v, c.seen), "%v", c.seen)
	}
	require.Equal(t, map[string]string{"hotel": "released", "car": "canceled", "payment": "declined"},
		StepsOf(v, []string{"hotel.held", "car.booked", "payment.declined", "car.canceled", "hotel.released"}, StatusCanceled))
	require.Equal(t, StatusConfirmed, ProjectOf("", []string{"hotel.held", "payment.charged", "car.booked"}), "a default trip still confirms on its car")
}

// TestTripTimesAtPostgresPrecision (issue 19 item 7): the first answer
// gave settled_at with nanoseconds and its replay (read back from
// PostgreSQL) with microseconds; both now say the same.
func TestTripTimesAtPostgresPrecision(t *testing.T) {
	at := time.Date(2026, 12, 2, 7, 30, 0, 123456789, time.UTC)
	tr := tripFromRow(dbsqlc.Trip{TripID: "T-1", Status: StatusConfirmed, CreatedAt: at, SettledAt: &at})
	want := time.Date(2026, 12, 2, 7, 30, 0, 123456000, time.UTC)
	require.Equal(t, want, tr.CreatedAt)
	require.Equal(t, want, *tr.SettledAt)
	b, err := json.Marshal(tr)
	require.NoError(t, err)
	require.Contains(t, string(b), `"settled_at":"2026-12-02T07:30:00.123456Z"`)
}
