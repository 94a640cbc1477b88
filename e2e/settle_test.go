package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/reconciler"
	"github.com/tripsaga/tripsaga/sim"
)

// TestSettleAForwardStepDone (issue 22, item 2's outcome done) runs a
// system whose hotel answers the trip's hold 401 for good (its credentials
// expired): the hold is unknown, company_credentials is raised and the
// step is asked again and again (its deadline is long, so it is not undone
// meanwhile); the trip stays pending. An operator holds the room by hand
// and settles the step done: its retries stop, its incident is resolved by
// them, hotel.held is published once (with settled_by and the trip
// request), and the saga goes on from there on its own: the card charged,
// the car booked, the trip confirmed and judged whole from the companies'
// records, with one mail. A second settle of the step is refused (409),
// and publishes nothing.
func TestSettleAForwardStepDone(t *testing.T) {
	// Its own stack: it runs beside the other tests that have one.
	t.Parallel()
	ctx := context.Background()
	const token = "tok-settle"
	s := ownStack(t, "settle",
		reconciler.OperatorTokenEnv+"="+token,
		"STEP_DEADLINE_MS=600000", // unknown for the whole test, never undone at its deadline
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
	const email = "settle-done@example.com"
	require.NoError(t, sim.AddFault(ctx, urls["HOTEL_URL"], sim.Rule{Op: sim.OpHold, Fault: sim.FaultUnauthorized, Reason: "token expired",
		Match: map[string]string{"guest.email": email}}))

	body := strings.Replace(strings.Replace(validTrip, "ada@example.com", email, 1), "tok_visa_ok", "tok_settle_done", 1)
	resp, err := http.Post(s.URL("trips")+"/trips", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	var answer struct {
		TripID string `json:"trip_id"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	resp.Body.Close()
	require.Contains(t, []int{201, 202}, resp.StatusCode)
	trip := answer.TripID
	require.NotEmpty(t, trip)

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
	var tv struct{ Status string }
	testenv.Eventually(t, func() bool { return incident("company_credentials") != nil }, "the 401 raises company_credentials")
	require.Equal(t, "hotel", incident("company_credentials").Step)
	getJSON(t, s.URL("trips")+"/trips/"+trip, &tv)
	require.Equal(t, "pending", tv.Status, "stuck going forward: nothing decided")
	require.Zero(t, mails())

	// Refused before anything is recorded: the hold's undo was never asked
	// for, so it cannot be settled undone.
	_, err = cli("incidents", "settle", trip, "--service", "hotel", "--outcome", "undone", "--reason", "r")
	require.ErrorContains(t, err, "409")

	// The operator settles the step done. The room they held by phone is
	// made at the company below, after the settle: made before, the
	// runner's next ask by key would find it and finish the step itself,
	// and this test is about the settle.
	out, err := cli("incidents", "settle", trip, "--service", "hotel", "--outcome", "done", "--reason", "held by phone, ticket 7", "--operator", "ada")
	require.NoError(t, err, out)
	in := time.Now().UTC().AddDate(0, 0, 21).Format(time.DateOnly)
	hold, err := json.Marshal(map[string]any{"trip_id": trip, "property_id": "P-100", "check_in": in, "nights": 2,
		"guest": map[string]string{"name": "Ada Example", "email": "by-phone@example.com"}})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, urls["HOTEL_URL"]+"/holds", bytes.NewReader(hold))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", trip+":hotel")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the room held by hand, under the step's key")

	testenv.Eventually(t, func() bool {
		getJSON(t, s.URL("trips")+"/trips/"+trip, &tv)
		return tv.Status == "confirmed"
	}, "the saga goes on from the settled step: confirmed")
	testenv.Eventually(t, func() bool { return mails() == 1 }, "one confirmation mail")

	e := envOf(s, false)
	o := demo.TripOutcome{TripID: trip, Status: "confirmed"}
	e.Records(ctx, &o, "tok_settle_done")
	require.Equal(t, demo.Whole, o.Verdict, "judged from the companies' records: %+v", o)
	require.Equal(t, 1, o.Charges, "charged once")

	var steps struct {
		Items []struct{ Step, Status, Outcome string }
	}
	getJSON(t, s.URL("hotel")+"/steps/"+trip, &steps)
	require.Len(t, steps.Items, 1)
	require.Equal(t, "done", steps.Items[0].Status)
	require.Contains(t, steps.Items[0].Outcome, "settled by hand: done by ada (held by phone, ticket 7)")
	var oplog struct {
		Items []struct{ Action, Effect string }
	}
	getJSON(t, s.URL("hotel")+"/operator/"+trip, &oplog)
	require.Len(t, oplog.Items, 1)
	require.Contains(t, oplog.Items[0].Effect, "settled by hand (done): step hotel is done, its retries stopped, 1 incident(s) resolved; hotel.held published")
	inc := incident("company_credentials")
	require.NotNil(t, inc.ResolvedAt, "the settle resolved the incident")
	require.Equal(t, "ada", inc.ResolvedBy)

	// hotel.held is in its stream once, saying who settled it.
	held := func() (uint64, *jetstream.RawStreamMsg) {
		nc, err := s.ConnectNATS(natsauth.Admin)
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		st, err := js.Stream(ctx, events.StreamHotel)
		require.NoError(t, err)
		subject := "hotel.held." + trip
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
		require.NoError(t, err)
		m, err := st.GetLastMsgForSubject(ctx, subject)
		require.NoError(t, err)
		return info.State.Subjects[subject], m
	}
	n, m := held()
	require.EqualValues(t, 1, n, "hotel.held published once")
	var d events.StepData
	require.NoError(t, json.Unmarshal(m.Data, &d))
	require.Equal(t, "ada", d.SettledBy)
	require.NotNil(t, d.Request, "it carries the trip request, for the next step")

	// Never twice.
	_, err = cli("incidents", "settle", trip, "--service", "hotel", "--outcome", "done", "--reason", "again")
	require.ErrorContains(t, err, "409")
	require.ErrorContains(t, err, "a step is settled once")
	getJSON(t, s.URL("hotel")+"/operator/"+trip, &oplog)
	require.Len(t, oplog.Items, 1, "the refused settle reached no service")
	n, _ = held()
	require.EqualValues(t, 1, n, "and published nothing")
	require.Equal(t, 1, mails(), "still one mail")
}
