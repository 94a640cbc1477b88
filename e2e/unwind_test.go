package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/reconciler"
	"github.com/tripsaga/tripsaga/sim"
)

// TestUnwindGoesOnPastAStuckUndo runs a system whose car is sold out for
// two trips: one whose refunds the card processor refuses for good
// (422 card closed), one whose refunds fail (503) for longer than the
// incident limit (INCIDENT_AFTER=3). In both the hotel releases the room
// once the refund raised its incident, while the refund goes on being
// retried: the trip is canceling with the payment named open, the charge
// still charged, the incident naming the step. The first is ended by an
// operator's settle (canceled, one mail, the incident resolved by them;
// a second settle and a settle of the released hotel are refused), the
// second by the card processor coming back.
func TestUnwindGoesOnPastAStuckUndo(t *testing.T) {
	// Its own stack: it runs beside the other tests that have one.
	t.Parallel()
	ctx := context.Background()
	s := ownStack(t, "unwind",
		reconciler.OperatorTokenEnv+"=tok-unwind", "INCIDENT_AFTER=3", "UNDO_BACKOFF_MAX_MS=1000",
	)
	cli := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), reconciler.OperatorTokenEnv+"=tok-unwind")
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
	require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut}))
	require.NoError(t, sim.AddFault(ctx, urls["PAYMENTS_URL"], sim.Rule{Op: sim.OpRefund, Fault: sim.FaultRefuse, Reason: "card closed",
		Match: map[string]string{"card_token": "tok_closed"}}))
	failing, err := sim.AddFaultRule(ctx, urls["PAYMENTS_URL"], sim.Rule{Op: sim.OpRefund, Fault: sim.FaultFail,
		Match: map[string]string{"card_token": "tok_flaky"}})
	require.NoError(t, err)

	book := func(card string) string {
		body := strings.Replace(validTrip, "tok_visa_ok", card, 1)
		req, err := http.NewRequest(http.MethodPost, s.URL("trips")+"/trips", strings.NewReader(body))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var tr struct {
			TripID string `json:"trip_id"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&tr))
		require.NotEmpty(t, tr.TripID)
		return tr.TripID
	}
	refused, flaky := book("tok_closed"), book("tok_flaky")

	type tripView struct {
		Status   string
		Steps    map[string]string
		OpenUndo []string `json:"open_undo"`
	}
	company := func(res, key string) string {
		var v struct{ Status string }
		getJSON(t, urls[res]+"/"+map[string]string{"HOTEL_URL": "holds", "PAYMENTS_URL": "charges"}[res]+"/"+url.PathEscape(key), &v)
		return v.Status
	}
	incident := func(trip, kind string) *reconciler.ServiceIncident {
		var body struct{ Items []reconciler.ServiceIncident }
		getJSON(t, s.URL("reconciler")+"/api/incidents", &body)
		for _, in := range body.Items {
			if in.TripID == trip && in.Kind == kind {
				return &in
			}
		}
		return nil
	}
	mails := func(trip string) int {
		var m struct{ Items []any }
		getJSON(t, urls["MAIL_URL"]+"/messages?trip_id="+url.QueryEscape(trip), &m)
		return len(m.Items)
	}
	for _, c := range []struct{ trip, kind string }{{refused, "compensation_refused"}, {flaky, "compensation_stuck"}} {
		testenv.Eventually(t, func() bool { return incident(c.trip, c.kind) != nil }, c.kind+" raised for "+c.trip)
		testenv.Eventually(t, func() bool { return company("HOTEL_URL", c.trip+":hotel") == "released" },
			"the room is released after the refund's incident, while the refund is owed")
		in := incident(c.trip, c.kind)
		require.Equal(t, "payment", in.Service)
		require.Equal(t, "payment", in.Step, "the incident names the open step")
		require.Nil(t, in.ResolvedAt)
		var tv tripView
		testenv.Eventually(t, func() bool {
			getJSON(t, s.URL("trips")+"/trips/"+c.trip, &tv)
			return slices.Equal(tv.OpenUndo, []string{"payment"})
		}, "GET /trips names the open undo")
		require.Equal(t, "canceling", tv.Status)
		require.Equal(t, map[string]string{"hotel": "released", "payment": "refund_stuck", "car": "sold_out"}, tv.Steps)
		require.Equal(t, "charged", company("PAYMENTS_URL", c.trip+":charge"), "the card line is still open")
		require.Zero(t, mails(c.trip), "no mail while canceling")
	}
	testenv.Eventually(t, func() bool {
		var f struct{ Items []reconciler.Finding }
		getJSON(t, s.URL("reconciler")+"/findings", &f)
		return slices.ContainsFunc(f.Items, func(f reconciler.Finding) bool {
			return f.TripID == refused && f.Kind == reconciler.FindingOpenUndo && f.ResolvedAt == nil
		})
	}, "the reconciler calls it one open undo")

	// An operator refunds the closed card by hand and settles the refund.
	out, err := cli("incidents", "settle", refused, "--service", "hotel", "--outcome", "undone", "--reason", "r")
	require.ErrorContains(t, err, "409", "the hotel's release is done: nothing to settle")
	require.ErrorContains(t, err, "done already (hotel.released seen)", out)
	out, err = cli("incidents", "settle", refused, "--service", "payment", "--outcome", "undone", "--reason", "refunded by bank transfer, ticket 9", "--operator", "ada")
	require.NoError(t, err, out)
	testenv.Eventually(t, func() bool {
		var tv tripView
		getJSON(t, s.URL("trips")+"/trips/"+refused, &tv)
		return tv.Status == "canceled" && len(tv.OpenUndo) == 0
	}, "canceled once the refund is settled")
	testenv.Eventually(t, func() bool { return mails(refused) == 1 }, "one cancellation mail")
	in := incident(refused, "compensation_refused")
	require.NotNil(t, in.ResolvedAt, "the settle resolved the incident")
	require.Equal(t, "ada", in.ResolvedBy)
	var oplog struct {
		Items []struct{ Action, Effect string }
	}
	getJSON(t, s.URL("payment")+"/operator/"+refused, &oplog)
	require.Len(t, oplog.Items, 1)
	require.Contains(t, oplog.Items[0].Effect, "settled by hand (undone): step payment is compensated, its retries stopped, 1 incident(s) resolved; payment.refunded published")
	_, err = cli("incidents", "settle", refused, "--service", "payment", "--outcome", "undone", "--reason", "again")
	require.ErrorContains(t, err, "409", "never twice")

	// The card processor comes back: the flaky trip's refund goes through.
	_, err = sim.RemoveFault(ctx, urls["PAYMENTS_URL"], failing.ID)
	require.NoError(t, err)
	testenv.Eventually(t, func() bool {
		var tv tripView
		getJSON(t, s.URL("trips")+"/trips/"+flaky, &tv)
		return tv.Status == "canceled"
	}, "canceled once the refund went through")
	require.Equal(t, "refunded", company("PAYMENTS_URL", flaky+":charge"))
	testenv.Eventually(t, func() bool { return mails(flaky) == 1 }, "one cancellation mail")
	require.Equal(t, 1, mails(refused), "still one")
}
