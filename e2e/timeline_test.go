package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/reconciler"
)

// A confirmed trip's timeline, as `tripsaga timeline` prints it (found by
// the POST's Idempotency-Key) and as --json gives it: every service's
// events, the step services' log rows read over their HTTP APIs, and the
// companies' records in force.
func TestTimelineCommand(t *testing.T) {
	key := "timeline-" + time.Now().UTC().Format("150405.000000")
	code, body, _ := post(t, strings.Replace(validTrip, "ada@example.com", "timeline@example.com", 1),
		map[string]string{"Idempotency-Key": key, "Prefer": "wait=20"})
	require.Equal(t, http.StatusCreated, code, body)
	require.Equal(t, "confirmed", body["status"])
	trip := body["trip_id"].(string)

	run := func(args ...string) []byte {
		cmd := exec.Command(bin, append([]string{"timeline"}, args...)...)
		cmd.Env = append(os.Environ(), "RECONCILER_URL="+sys.URL("reconciler"))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		return out
	}
	var tl reconciler.Timeline
	testenv.Eventually(t, func() bool {
		require.NoError(t, json.Unmarshal(run("--json", trip), &tl))
		return tl.View != nil && tl.View.Mailed
	}, "the reconciler saw the trip to its mail")
	require.Empty(t, tl.Unread)
	require.Equal(t, timelineColumns(), tl.Columns, "trips, then the saga's services in order")
	kinds := map[string]bool{}
	for _, e := range tl.Entries {
		kinds[e.Column+" "+e.What] = true
	}
	for _, want := range []string{"trips trip.requested", "hotel hotel.held", "payment payment.charged", "car car.booked",
		"trips trip.confirmed", "trips mail.sent", "hotel hotel started", "payment payment finished", "car car finished"} {
		require.True(t, kinds[want], "%s on the timeline: %v", want, kinds)
	}
	status := map[string]string{}
	for _, r := range tl.Records {
		status[r.Company] = r.Record.Status()
	}
	want := map[string]string{"hotel": "held", "payments": "charged", "cars": "booked"}
	if demo.InsuranceOn(events.Selected()) {
		want["insurer"] = "active"
	}
	require.Equal(t, want, status)
	require.Contains(t, tl.Stopped, "settled: confirmed")

	out := string(run(key))
	require.Contains(t, out, "trip "+trip+": confirmed")
	require.Contains(t, out, "where it stopped: settled: confirmed")
	require.Contains(t, out, "car.booked")
	require.Regexp(t, `charges\s+\S+:\S+\s+charged`, out)

	_, err := exec.Command(bin, "timeline", "--dir", t.TempDir(), "T-nothing").CombinedOutput()
	require.Error(t, err, "no up runs in an empty folder")
}
