package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/sim"
)

// cancelRow is one way the traveler's cancellation of a confirmed trip is
// hurt: a fault point armed for the trip (SIGKILL or error at a line of
// the cancellation) or a company fault (an answer lost, a company failing
// for a while).
type cancelRow struct {
	name string
	// rule: "<point>:<action>" armed for the row's trip only (trip=, once=).
	rule string
	// company: a simulator fault rule for the row's trip, set before the
	// cancellation (its Match filled with the trip's email or card).
	company func(email, card string) (base string, r sim.Rule)
	// incident: the step that must raise an incident (and settle).
	incident string
}

func cancelRows(urls map[string]string) []cancelRow {
	// A SIGKILL at every point of the cancellation's steps, as
	// TestFaultPoints does for the booking's.
	var rows []cancelRow
	for _, p := range fault.Points {
		if strings.Contains(p, ".traveler_") {
			rows = append(rows, cancelRow{name: fault.Process(p) + " killed at " + p, rule: p + ":" + fault.Kill})
		}
	}
	return append(rows, []cancelRow{
		{name: "hotel killed when the cancellation event is committed", rule: fault.HotelInboxAfterCommit + ":" + fault.Kill},
		{name: "trips killed while it projects the cancellation", rule: fault.TripsInboxAfterCommit + ":" + fault.Kill},
		{name: "refund answer read fails", rule: fault.PaymentTravelerRefundAnswerUnread + ":" + fault.Error},
		{name: "refund answer lost by the card processor", company: func(_, card string) (string, sim.Rule) {
			return urls["PAYMENTS_URL"], sim.Rule{Op: sim.OpRefund, Fault: sim.FaultLoseAnswer, Times: 1, Match: map[string]string{"card_token": card}}
		}},
		{name: "car cancel answer lost by the car firm", company: func(email, _ string) (string, sim.Rule) {
			return urls["CARS_URL"], sim.Rule{Op: sim.OpCancel, Fault: sim.FaultLoseAnswer, Times: 1, Match: map[string]string{"driver.email": email}}
		}},
		// Counted, not timed, so that a slow machine still makes the
		// attempts that raise the incident (INCIDENT_AFTER=3).
		{name: "hotel release fails 4 times: incident, then settled", incident: "traveler_release", company: func(email, _ string) (string, sim.Rule) {
			return urls["HOTEL_URL"], sim.Rule{Op: sim.OpRelease, Fault: sim.FaultFail, Times: 4, Match: map[string]string{"guest.email": email}}
		}},
		{name: "refunds fail 4 times: incident, then settled", incident: "traveler_refund", company: func(_, card string) (string, sim.Rule) {
			return urls["PAYMENTS_URL"], sim.Rule{Op: sim.OpRefund, Fault: sim.FaultFail, Times: 4, Match: map[string]string{"card_token": card}}
		}},
	}...)
}

// cancelRig is the stack TestCancellationFaults runs on: its children
// read their fault rules from one file.
type cancelRig struct {
	*faultRig
	env *demo.Env
}

// confirmed books a trip whose check-in is 3 days away (the policy's
// "inside 7 days" band: 50 % of one night), waits until it is confirmed
// and its confirmation email sent, and returns its id, email and card.
func (g *cancelRig) confirmed(t *testing.T, tag string) (id, email, card string) {
	t.Helper()
	email = tag + "+" + g.nonce + "@example.com"
	card = "tok_" + tag + "_" + g.nonce
	in := time.Now().UTC().AddDate(0, 0, 3)
	req := events.TripRequest{
		Traveler: events.Person{Name: "Ada Example", Email: email},
		Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: in.Format(time.DateOnly), Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: in.Format(time.DateOnly), Return: in.AddDate(0, 0, 2).Format(time.DateOnly)},
		Payment:  events.PaymentRequest{CardToken: card, AmountCents: 33001, Currency: "USD"},
	}
	body, err := json.Marshal(req)
	require.NoError(t, err)
	var out struct {
		TripID string `json:"trip_id"`
		Status string `json:"status"`
	}
	// Another lane may have killed trips: send again with the same key.
	wait(t, 60*time.Second, func() bool {
		hr, err := http.NewRequest(http.MethodPost, g.s.URL("trips")+"/trips", bytes.NewReader(body))
		require.NoError(t, err)
		hr.Header.Set("Prefer", "wait=30")
		hr.Header.Set("Idempotency-Key", "cx-"+tag+"-"+g.nonce)
		resp, err := g.http.Do(hr)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&out) == nil && out.Status == "confirmed"
	}, "trip %s is confirmed", tag)
	urls := g.s.CompanyURLs()
	wait(t, 60*time.Second, func() bool {
		var m struct {
			Items []any `json:"items"`
		}
		g.getJSON(urls["MAIL_URL"]+"/messages?trip_id="+url.QueryEscape(out.TripID), &m)
		return len(m.Items) == 1
	}, "trip %s's confirmation is mailed", out.TripID)
	return out.TripID, email, card
}

// cancel posts the traveler's cancellation (Prefer: wait=0), sent again
// with the same key while trips is down, and returns the answer's code
// and body.
func (g *cancelRig) cancel(t *testing.T, id, key string) (int, map[string]any) {
	t.Helper()
	var code int
	var body map[string]any
	wait(t, 60*time.Second, func() bool {
		hr, err := http.NewRequest(http.MethodPost, g.s.URL("trips")+"/trips/"+id+"/cancellation", nil)
		require.NoError(t, err)
		hr.Header.Set("Prefer", "wait=0")
		if key != "" {
			hr.Header.Set("Idempotency-Key", key)
		}
		resp, err := g.http.Do(hr)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		code, body = resp.StatusCode, nil
		_ = json.Unmarshal(raw, &body)
		return code != http.StatusServiceUnavailable
	}, "POST /trips/%s/cancellation is answered", id)
	return code, body
}

// TestCancellationFaults (issue 11): the traveler's cancellation of a
// confirmed trip under the kills and faults the booking is tested with,
// on a stack of its own whose processes read their fault rules from a
// file. Each row books a trip three days ahead (fee band "inside 7 days":
// 50 % of one night of 33001 cents over 2 nights = 8250, refund 24751),
// waits for it to be confirmed and mailed, arms its rule for that trip
// only, cancels it, checks that the rule fired (and that a killed process
// was restarted), and judges the trip from the companies' own records
// (demo.JudgeCancellation): canceled_by_traveler, hold released, car
// canceled, one refund line of exactly 24751, one cancellation email.
// Rows of one process run one after the other, the processes side by
// side. Then the reconciler, whose sweep runs every second here, has no
// half finding and sees every trip canceled_by_traveler. The API's
// refusals (a pending or canceled trip, no key, another key, an unknown
// trip) are checked on the same stack.
func TestCancellationFaults(t *testing.T) {
	// Its own stack: it runs beside the other tests that have one.
	t.Parallel()
	require.NotEmpty(t, bin, "TestMain builds the binary")
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o711))
	g := &cancelRig{faultRig: &faultRig{
		rules: filepath.Join(dir, "faults.rules"), markers: filepath.Join(dir, "markers"),
		nonce: strconv.FormatInt(time.Now().UnixNano()%1e9, 36), http: &http.Client{Timeout: 60 * time.Second},
		armed: map[string]string{}, scenario: map[string]string{}, card: map[string]string{},
	}}
	require.NoError(t, os.MkdirAll(g.markers, 0o755))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	g.s, err = stack.Start(ctx, stack.Config{Dir: filepath.Join(dir, "stack"), Binary: bin, Env: []string{
		fault.EnvFile + "=" + g.rules, fault.EnvDir + "=" + g.markers,
		"RECONCILE_INTERVAL_MS=1000",
		// The companies' rows fail for 6 s: an incident after 3 attempts.
		"INCIDENT_AFTER=3",
	}})
	require.NoError(t, err)
	defer g.s.Stop()
	defer func() {
		if t.Failed() {
			for _, name := range stack.Processes {
				b, _ := os.ReadFile(g.s.LogPath(name))
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("==== %s log (tail)\n%s", name, b)
			}
		}
	}()
	urls := g.s.CompanyURLs()
	g.env = &demo.Env{
		TripsURL: g.s.URL("trips"), PaymentURL: g.s.URL("payment"),
		HotelURL: urls["HOTEL_URL"], PaymentsURL: urls["PAYMENTS_URL"], CarsURL: urls["CARS_URL"], MailURL: urls["MAIL_URL"],
	}

	var mu sync.Mutex
	var canceled []string
	rows := cancelRows(urls)
	lanes := map[string][]int{}
	for i, r := range rows {
		lane := "companies"
		if r.rule != "" {
			lane = fault.Process(strings.SplitN(r.rule, ":", 2)[0])
		}
		lanes[lane] = append(lanes[lane], i)
	}
	var up sync.Map // process -> when it was last restarted
	var lanesDone sync.WaitGroup
	for lane, idx := range lanes {
		lanesDone.Go(func() {
			t.Run(lane, func(t *testing.T) {
				for _, i := range idx {
					r := rows[i]
					t.Run(r.name, func(t *testing.T) {
						id := g.row(t, r, fmt.Sprintf("cx%02d", i), &up)
						mu.Lock()
						canceled = append(canceled, id)
						mu.Unlock()
					})
				}
			})
		})
	}
	lanesDone.Go(func() { t.Run("API", g.api) })
	lanesDone.Wait()

	// The reconciler judges them from the companies' records too.
	rec := g.s.URL("reconciler")
	for _, id := range canceled {
		wait(t, 60*time.Second, func() bool {
			var v struct {
				Status   string `json:"status"`
				Settled  string `json:"settled"`
				Findings []struct {
					Kind       string     `json:"kind"`
					ResolvedAt *time.Time `json:"resolved_at"`
				} `json:"findings"`
			}
			if g.getJSON(rec+"/view/"+id, &v) != http.StatusOK || v.Settled != "canceled_by_traveler" {
				return false
			}
			for _, f := range v.Findings {
				if f.ResolvedAt == nil {
					return false
				}
			}
			return true
		}, "the reconciler sees trip %s canceled by the traveler with no open finding", id)
	}
	var sweep struct {
		Items []struct {
			TripID string `json:"trip_id"`
			Kind   string `json:"kind"`
			Detail string `json:"detail"`
		} `json:"items"`
	}
	require.Equal(t, http.StatusOK, g.getJSON(rec+"/findings", &sweep))
	for _, f := range sweep.Items {
		require.NotEqual(t, "half", f.Kind, "trip %s: %s", f.TripID, f.Detail)
	}
}

// row runs one row of TestCancellationFaults and returns its trip.
func (g *cancelRig) row(t *testing.T, r cancelRow, name string, up *sync.Map) string {
	id, email, card := g.confirmed(t, name)
	proc := ""
	if r.rule != "" {
		proc = fault.Process(strings.SplitN(r.rule, ":", 2)[0])
		if v, ok := up.Load(proc); ok {
			if d := 5*time.Second - time.Since(v.(time.Time)); d > 0 {
				time.Sleep(d) // not an assertion: the supervisor's restart backoff
			}
		}
		g.arm(t, name, r.rule+":once="+name+":trip="+id)
		defer g.arm(t, name, "")
	}
	if r.company != nil {
		base, rule := r.company(email, card)
		require.NoError(t, sim.AddFault(context.Background(), base, rule))
	}
	code, body := g.cancel(t, id, "cancel-"+name)
	require.Contains(t, []int{http.StatusOK, http.StatusAccepted}, code, "%v", body)
	if r.rule != "" {
		path := fault.Marker(g.markers, name)
		wait(t, 60*time.Second, func() bool { _, err := os.Stat(path); return err == nil }, "%s fires for trip %s", r.rule, id)
		var m map[string]string
		wait(t, 5*time.Second, func() bool { m = marker(path); return m["pid"] != "" }, "marker %s is written", path)
		require.Equal(t, id, m["trip_id"], "the rule fired for its trip")
		if strings.HasSuffix(r.rule, ":"+fault.Kill) {
			wait(t, 60*time.Second, func() bool { return strconv.Itoa(g.s.Pid(proc)) != m["pid"] }, "%s (pid %s) is restarted", proc, m["pid"])
			require.NoError(t, g.s.WaitReady(context.Background(), proc))
			up.Store(proc, time.Now())
		}
	}
	o := g.env.JudgeCancellation(context.Background(), id, card, 8250, 24751)
	b, _ := json.Marshal(o)
	t.Logf("trip %s: %s", id, b)
	require.Equal(t, "canceled_by_traveler", o.Status, "%s", b)
	require.Equal(t, demo.FeeKept, o.Verdict, "judged from the companies' records: %s", b)
	require.Equal(t, "released", o.Hold, "%s", b)
	require.Equal(t, "canceled", o.Booking, "%s", b)
	require.Equal(t, []int64{33001, 24751, 24751}, []int64{o.ChargedCents, o.RefundedCents, o.RefundLineCents}, "refunded once, exactly the charge minus the fee: %s", b)
	require.Equal(t, 1, o.Mails, "one cancellation email: %s", b)
	if r.incident != "" {
		svc := map[string]string{"traveler_release": "hotel", "traveler_refund": "payment"}[r.incident]
		var inc struct {
			Items []struct {
				TripID     string     `json:"trip_id"`
				Step       string     `json:"step"`
				Kind       string     `json:"kind"`
				ResolvedAt *time.Time `json:"resolved_at"`
			} `json:"items"`
		}
		require.Equal(t, http.StatusOK, g.getJSON(g.s.URL(svc)+"/incidents", &inc))
		found := false
		for _, i := range inc.Items {
			if i.TripID == id && i.Step == r.incident {
				found = true
				require.Equal(t, "forward_stuck", i.Kind)
				require.NotNil(t, i.ResolvedAt, "the incident is resolved once the step settled")
			}
		}
		require.True(t, found, "an incident was raised for %s of %s: %+v", r.incident, id, inc.Items)
	}
	return id
}

// api checks the refusals of POST /trips/{id}/cancellation and what
// GET /trips/{id} shows of a cancellation.
func (g *cancelRig) api(t *testing.T) {
	ctx := context.Background()
	urls := g.s.CompanyURLs()

	// A booking still running is refused, naming its status; so is a
	// canceled trip.
	email := "cxpending+" + g.nonce + "@example.com"
	require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultHang, DelayMS: 60000, Match: map[string]string{"driver.email": email}}))
	hr, err := http.NewRequest(http.MethodPost, g.s.URL("trips")+"/trips", strings.NewReader(strings.Replace(validTrip, "ada@example.com", email, 1)))
	require.NoError(t, err)
	hr.Header.Set("Prefer", "wait=0")
	resp, err := g.http.Do(hr)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	pending := out["trip_id"].(string)
	code, body := g.cancel(t, pending, "k-pending")
	require.Equal(t, http.StatusConflict, code, "%v", body)
	require.Contains(t, []string{"pending", "canceling"}, body["trip_status"], "%v", body)
	require.Contains(t, body["detail"], body["trip_status"])

	// No key, an unknown trip.
	code, body = g.cancel(t, pending, "")
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, "Idempotency-Key", body["errors"].([]any)[0].(map[string]any)["field"])
	code, _ = g.cancel(t, "T-01NOSUCHTRIP", "k")
	require.Equal(t, http.StatusNotFound, code)

	// The same key again answers the same cancellation; another key is
	// refused naming the status; the trip keeps its booking history.
	id, _, _ := g.confirmed(t, "cxapi")
	code, first := g.cancel(t, id, "k-api")
	require.Equal(t, http.StatusAccepted, code, "%v", first)
	require.Equal(t, "canceling_by_traveler", first["status"])
	c := first["cancellation"].(map[string]any)
	require.Equal(t, []any{8250.0, 24751.0, 33001.0, "inside 7 days"}, []any{c["fee_cents"], c["refund_cents"], c["charged_cents"], c["band"]})
	code, again := g.cancel(t, id, "k-api")
	require.Contains(t, []int{http.StatusOK, http.StatusAccepted}, code)
	require.Equal(t, c["requested_at"], again["cancellation"].(map[string]any)["requested_at"], "one cancellation")
	code, body = g.cancel(t, id, "k-other")
	require.Equal(t, http.StatusConflict, code)
	require.Contains(t, []string{"canceling_by_traveler", "canceled_by_traveler"}, body["trip_status"])
	o := g.env.JudgeCancellation(ctx, id, "tok_cxapi_"+g.nonce, 8250, 24751)
	require.Equal(t, demo.FeeKept, o.Verdict, "%+v", o)
	var trip map[string]any
	require.Equal(t, http.StatusOK, g.getJSON(g.s.URL("trips")+"/trips/"+id, &trip))
	require.Equal(t, "canceled_by_traveler", trip["status"])
	booked := map[string]any{"hotel": "held", "payment": "charged", "car": "booked"}
	undone := map[string]any{"hotel": "released", "payment": "refunded", "car": "canceled"}
	if demo.InsuranceOn(events.Selected()) { // the stack inherits STEPS
		booked["insurance"], undone["insurance"] = "bought", "canceled"
	}
	require.Equal(t, booked, trip["steps"], "the booking's history is kept")
	require.Equal(t, undone, trip["cancellation"].(map[string]any)["steps"])
	require.NotEmpty(t, trip["settled_at"])
	require.NotEmpty(t, trip["cancellation"].(map[string]any)["canceled_at"])

	// The pending trip ends canceled (its car never answers) and is then
	// refused as canceled.
	wait(t, 90*time.Second, func() bool {
		var tr struct {
			Status string `json:"status"`
		}
		g.getJSON(g.s.URL("trips")+"/trips/"+pending, &tr)
		return tr.Status == "canceled"
	}, "trip %s is canceled", pending)
	code, body = g.cancel(t, pending, "k-pending")
	require.Equal(t, http.StatusConflict, code)
	require.Equal(t, "canceled", body["trip_status"])
}
