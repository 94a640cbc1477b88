package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/reconciler"
)

// TestSituationsChargeLast runs every situation of the demo on a stack of
// the charge-last order (STEPS=hotel,car,payment: the payment is the
// pivot, the car compensable). Each trip ends whole or empty by the
// companies' own records, with one mail; a sold-out car leaves no charge
// line at all; a declined card releases the hotel and cancels the booked
// car by its key; the car's cancel failing for 30 s or refused for good
// (then settled by an operator) holds the trip canceling with the car
// open while the room is released, and it settles empty.
func TestSituationsChargeLast(t *testing.T) {
	require.NotEmpty(t, bin, "TestMain builds the binary")
	cat, err := events.ParseSteps(events.ChargeLast)
	require.NoError(t, err)
	require.Equal(t, "payment", demo.PivotOf(cat))
	s := ownStack(t, "chargelast",
		reconciler.OperatorTokenEnv+"="+e2eToken,
		events.StepsVar+"="+events.ChargeLast,
		// The payment killed after its charge must be back before the
		// charge's deadline, or it is undone by key (canceled, empty, not
		// the whole trip the situation wants): on a loaded machine with two
		// stacks a restart took 15 s, past the default 8 s.
		"STEP_DEADLINE_MS=20000",
	)
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range stack.Processes {
				b, _ := os.ReadFile(s.LogPath(name))
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("==== %s log (tail)\n%s", name, b)
			}
		}
	})
	sits := demo.SituationsOf(cat)
	names := make([]string, 0, len(sits))
	for _, st := range sits {
		names = append(names, st.Name)
	}
	require.Contains(t, names, "car cancels fail for 30 s while undoing")
	require.NotContains(t, names, "refunds fail for 30 s while undoing", "no refund undoes a charge-last trip")
	for _, sit := range sits {
		t.Run(sit.Name, func(t *testing.T) {
			t.Parallel()
			e := envOf(s, false)
			o := sit.Run(context.Background(), e)
			b, _ := json.MarshalIndent(o, "", "  ")
			require.Truef(t, o.OK, "outcome:\n%s", b)
			require.NotEqual(t, demo.Half, o.Verdict)
			for _, tr := range o.Trips {
				require.Equal(t, sit.WantStatus, tr.Status, "outcome:\n%s", b)
				require.Equal(t, 1, tr.Mails, "the traveler is emailed once when the trip settles")
				switch sit.Name {
				case "car sold out":
					require.Equal(t, "released", tr.Hold)
					require.Equal(t, "none", tr.Charge, "the card is never touched")
					require.Equal(t, []int{0, 0}, []int{tr.Charges, tr.Refunds}, "no statement line at all")
					require.Equal(t, "none", tr.Booking)
					require.Equal(t, "car sold out", tr.Reason)
				case "card declined":
					require.Equal(t, "released", tr.Hold)
					require.Equal(t, "declined", tr.Charge)
					require.Equal(t, "canceled", tr.Booking, "the booked car is canceled by its key")
					require.Equal(t, []int{0, 0}, []int{tr.Charges, tr.Refunds})
					require.Equal(t, map[string]string{"hotel": "released", "car": "canceled", "payment": "declined"}, tripSteps(t, s, tr.TripID),
						"the trips service shows the car's compensation")
				case "car times out, never books":
					require.Contains(t, []string{"none", "canceled"}, tr.Booking)
					require.Equal(t, "released", tr.Hold)
					require.Equal(t, []int{0, 0}, []int{tr.Charges, tr.Refunds}, "the card is never touched")
				case "car cancels fail for 30 s while undoing":
					require.Equal(t, "canceling", tr.AnswerStatus, "canceling while the car's cancels fail")
					require.Equal(t, "canceled", tr.Booking)
					require.Equal(t, "released", tr.Hold)
					require.Contains(t, strings.Join(o.Notes, "\n"), "incident compensation_stuck raised")
				case "car cancel refused for good, then settled by an operator":
					require.Equal(t, "canceled", tr.Booking, "canceled by hand")
					require.Equal(t, "released", tr.Hold)
					require.Contains(t, strings.Join(o.Notes, "\n"), "open undo: car")
				case "payment killed (SIGKILL) after the charge", "same POST twice, one Idempotency-Key", "car booked, answer lost":
					require.Equal(t, 1, tr.Charges, "charged once")
					require.Equal(t, "booked", tr.Booking)
				}
			}
		})
	}
}

// tripSteps returns the steps of trip as the trips service shows them
// (GET /trips/{id}, "steps").
func tripSteps(t *testing.T, s *stack.Stack, trip string) map[string]string {
	t.Helper()
	resp, err := http.Get(s.URL("trips") + "/trips/" + url.PathEscape(trip))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var v struct {
		Steps map[string]string `json:"steps"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	return v.Steps
}
