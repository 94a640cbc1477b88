package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/internal/testenv"
)

// TestReplayKilledAfterItsClear (issue 19 item 9): `tripsaga replay
// reconciler` SIGKILLed right after the transaction that cleared the view
// committed. The view was left empty for good, the sweep then judged it
// and raised false orphan findings for every trip's company records, and
// the dashboard said "unfinished: 0". Now the rebuild is recorded as
// unfinished until a replay finishes it: the sweep raises nothing
// meanwhile and says why, the figures and the dashboard say the view is
// half rebuilt, and the next replay makes the view whole again.
func TestReplayKilledAfterItsClear(t *testing.T) {
	var trips []string
	for i := range 2 {
		code, out, _ := post(t, validTrip, map[string]string{"Idempotency-Key": fmt.Sprintf("rebuild-killed-%d-%s", i, t.Name())})
		require.Contains(t, []int{201, 202}, code, out)
		trips = append(trips, out["trip_id"].(string))
	}
	settled(t, trips)
	rec := sys.URL("reconciler")

	cmd := exec.Command(bin, "replay", "reconciler", "--progress=false")
	cmd.Env = append(os.Environ(), fault.EnvRules+"="+fault.ReconcilerReplayAfterClear+":"+fault.Kill)
	for k, v := range sys.Env() {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the replay was not killed: %s", out)
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the replay ended by %v, not SIGKILL: %s", err, out)

	var fig struct {
		Rebuild *struct {
			Running bool `json:"running"`
		} `json:"rebuild"`
	}
	// The killed replay's session holds the replay lock until PostgreSQL
	// has seen its connection close, which on a busy machine comes a
	// moment after the SIGKILL: until then a replay does run, as far as
	// anyone can tell.
	testenv.Eventually(t, func() bool {
		getJSON(t, rec+"/api/figures", &fig)
		return fig.Rebuild != nil && !fig.Rebuild.Running
	}, "the figures say the view is half rebuilt and no replay runs: it was killed")
	page := func() string {
		resp, err := http.Get(rec + "/")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	testenv.Eventually(t, func() bool { return strings.Contains(page(), "skipped: the rebuild of the view begun") },
		"a sweep after the kill is skipped, saying the rebuild stopped half-way")
	p := page()
	require.Contains(t, p, `id="rebuild"`)
	require.Contains(t, p, "The view is half rebuilt")
	noOrphans := func() error {
		var f struct {
			Items []struct {
				TripID string `json:"trip_id"`
				Kind   string `json:"kind"`
			} `json:"items"`
		}
		getJSON(t, rec+"/findings", &f)
		for _, it := range f.Items {
			for _, trip := range trips {
				if it.TripID == trip {
					return fmt.Errorf("a %s finding for %s, a trip the half-built view lacks", it.Kind, trip)
				}
			}
		}
		return nil
	}
	require.NoError(t, noOrphans())

	// The replay run again finishes the rebuild: the view holds the trips,
	// the figures no longer speak of a rebuild, the sweep runs again and
	// still finds nothing wrong with them.
	tripsaga(t, "replay", "reconciler", "--progress=false")
	for _, trip := range trips {
		var v struct{ Settled string }
		getJSON(t, rec+"/view/"+trip, &v)
		require.NotEmpty(t, v.Settled, "trip %s is back in the view", trip)
	}
	fig.Rebuild = nil
	getJSON(t, rec+"/api/figures", &fig)
	require.Nil(t, fig.Rebuild)
	testenv.Eventually(t, func() bool {
		p := page()
		return strings.Contains(p, "<th>last sweep</th>") && !strings.Contains(p, "skipped: the rebuild") && !strings.Contains(p, `id="rebuild"`)
	}, "the sweep runs again once the rebuild finished")
	require.NoError(t, noOrphans())
}
