package reconciler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A trip's "where it stopped" times the event that settled it from the
// request it answers: the booking for confirmed, the traveler's
// cancellation for canceled_by_traveler.
func TestStoppedAtTimesTheSettlingEvent(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 15, 19, 52, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	entries := []Entry{
		{At: at(0), Source: "event", What: "trip.requested"},
		{At: at(326), Source: "event", What: "trip.confirmed"},
		{At: at(2000), Source: "event", What: "trip.cancellation_requested"},
		{At: at(4048), Source: "event", What: "trip.canceled_by_traveler"},
	}
	got := stoppedAt(Timeline{View: &TripView{Settled: "canceled_by_traveler", FirstEventAt: t0, Mailed: true}, Entries: entries})
	require.Equal(t, "settled: canceled_by_traveler at 2026-11-30T15:19:56Z, 2.048s after the cancellation", got)
	got = stoppedAt(Timeline{View: &TripView{Settled: "confirmed", FirstEventAt: t0, Mailed: true}, Entries: entries[:2]})
	require.Equal(t, "settled: confirmed at 2026-11-30T15:19:52Z, 326ms after the request", got)
}

// Issue 19 item 5: an unsettled trip's "where it stopped" names the
// newest event with that event's own age, not the view's newest time
// paired with another event's name.
func TestStoppedAtPairsTheNewestEventWithItsAge(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	entries := []Entry{
		{At: t0, Source: "event", What: "trip.requested"},
		{At: t0.Add(2 * time.Second), Source: "event", What: "hotel.held"},
		{At: t0.Add(3 * time.Second), Source: "step", What: "payment started"},
	}
	// The view saw a later event (on a stream this timeline did not read).
	tl := Timeline{At: t0.Add(62 * time.Second), Entries: entries,
		View: &TripView{Status: "pending", FirstEventAt: t0, LastEventAt: t0.Add(50 * time.Second)}}
	require.Equal(t, "pending, not settled: the newest event is hotel.held, 1m0s ago", stoppedAt(tl))
	tl.Entries = nil
	require.Equal(t, "pending, not settled: the newest event is ?, 12s ago", stoppedAt(tl))
}
