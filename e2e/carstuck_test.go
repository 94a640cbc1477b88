package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"encoding/json"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/reconciler"
	"github.com/tripsaga/tripsaga/sim"
)

// TestUnwindGoesOnPastTheCarsStuckCancel (issue 22, item 1's rule for the
// pivot) runs a system whose car firm refuses our credentials on the
// booking and on every ask by key (401), so the booking is unknown until
// its deadline and then canceled by key, and whose cancels fail (503)
// past the incident limit (INCIDENT_AFTER=3) while the ask by key still
// cannot tell. The car's undo raises compensation_stuck and publishes
// car.cancel_stuck, on which the card is refunded and the room released
// while the cancel goes on being retried: the trip is canceling with the
// car named open, and no mail yet. An operator who saw the car firm's
// record settles the cancel undone: car.failed is published, the trip is
// canceled, empty by the companies' records, with one mail.
func TestUnwindGoesOnPastTheCarsStuckCancel(t *testing.T) {
	// Its own stack: it runs beside the other tests that have one.
	t.Parallel()
	ctx := context.Background()
	const token = "tok-carstuck"
	s := ownStack(t, "carstuck",
		reconciler.OperatorTokenEnv+"="+token, "INCIDENT_AFTER=3", "UNDO_BACKOFF_MAX_MS=1000", "STEP_DEADLINE_MS=4000",
	)
	cli := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), reconciler.OperatorTokenEnv+"="+token)
		for k, v := range s.Env() {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, stderr.String())
		}
		return string(out), err
	}
	urls := s.CompanyURLs()
	require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultUnauthorized, Reason: "token expired"}))
	require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpCancel, Fault: sim.FaultFail}))

	const card = "tok_carstuck"
	resp, err := http.Post(s.URL("trips")+"/trips", "application/json", strings.NewReader(strings.Replace(validTrip, "tok_visa_ok", card, 1)))
	require.NoError(t, err)
	var answer struct {
		TripID string `json:"trip_id"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	resp.Body.Close()
	trip := answer.TripID
	require.NotEmpty(t, trip)

	company := func(coll, key string) string {
		var v struct{ Status string }
		getJSON(t, map[string]string{"holds": urls["HOTEL_URL"], "charges": urls["PAYMENTS_URL"]}[coll]+"/"+coll+"/"+url.PathEscape(key), &v)
		return v.Status
	}
	incident := func(kind string) *reconciler.ServiceIncident {
		var b struct{ Items []reconciler.ServiceIncident }
		getJSON(t, s.URL("reconciler")+"/api/incidents", &b)
		for _, in := range b.Items {
			if in.TripID == trip && in.Kind == kind {
				return &in
			}
		}
		return nil
	}
	mails := func() int {
		var m struct{ Items []any }
		getJSON(t, urls["MAIL_URL"]+"/messages?trip_id="+url.QueryEscape(trip), &m)
		return len(m.Items)
	}
	type tripView struct {
		Status   string
		Steps    map[string]string
		OpenUndo []string `json:"open_undo"`
	}
	testenv.Eventually(t, func() bool { return incident("compensation_stuck") != nil }, "the car's cancel raises compensation_stuck")
	in := incident("compensation_stuck")
	require.Equal(t, "car", in.Step)
	require.Nil(t, in.ResolvedAt)
	testenv.Eventually(t, func() bool { return company("charges", trip+":charge") == "refunded" },
		"the card is refunded on car.cancel_stuck, while the car's cancel is retried")
	testenv.Eventually(t, func() bool { return company("holds", trip+":hotel") == "released" }, "and the room released")
	var tv tripView
	testenv.Eventually(t, func() bool {
		getJSON(t, s.URL("trips")+"/trips/"+trip, &tv)
		return slices.Equal(tv.OpenUndo, []string{"car"})
	}, "GET /trips names the car's undo open")
	require.Equal(t, "canceling", tv.Status)
	require.Equal(t, map[string]string{"hotel": "released", "payment": "refunded", "car": "cancel_stuck"}, tv.Steps)
	require.Zero(t, mails(), "no mail while canceling")
	testenv.Eventually(t, func() bool {
		var f struct{ Items []reconciler.Finding }
		getJSON(t, s.URL("reconciler")+"/findings", &f)
		return slices.ContainsFunc(f.Items, func(f reconciler.Finding) bool {
			return f.TripID == trip && f.Kind == reconciler.FindingOpenUndo && f.ResolvedAt == nil
		})
	}, "the reconciler calls it one open undo, not half")

	// The operator saw the car firm has no booking under the key, and
	// settles the cancel undone.
	out, err := cli("incidents", "settle", trip, "--service", "car", "--outcome", "undone", "--reason", "no booking at the car firm, ticket 3", "--operator", "ada")
	require.NoError(t, err, out)
	testenv.Eventually(t, func() bool {
		var tv tripView // fresh: open_undo is left out once it is empty
		getJSON(t, s.URL("trips")+"/trips/"+trip, &tv)
		return tv.Status == "canceled" && len(tv.OpenUndo) == 0
	}, "canceled once the car's cancel is settled")
	testenv.Eventually(t, func() bool { return mails() == 1 }, "one cancellation mail")
	var oplog struct {
		Items []struct{ Action, Effect string }
	}
	getJSON(t, s.URL("car")+"/operator/"+trip, &oplog)
	require.Len(t, oplog.Items, 1)
	require.Contains(t, oplog.Items[0].Effect, "settled by hand (undone): step car is failed, its retries stopped")
	require.Contains(t, oplog.Items[0].Effect, "car.failed published")
	require.NotNil(t, incident("compensation_stuck").ResolvedAt)
	o := demo.TripOutcome{TripID: trip, Status: "canceled"}
	envOf(s, false).Records(ctx, &o, card)
	require.Equal(t, demo.Empty, o.Verdict, "empty by the companies' records: %+v", o)
	require.Equal(t, 1, o.Refunds)
}
