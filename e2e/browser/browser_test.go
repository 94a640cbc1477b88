// Package browser drives the reconciler's operator console in a real
// headless Chromium (Debian's chromium package) through chromedp, against
// the whole system started as a user starts it (the stack supervisor, one
// process per service, an embedded NATS server, a private PostgreSQL
// cluster, the company simulators), while a fault runs: the card
// processor's refunds fail.
//
// The test saves screenshots into the folder named by
// TRIPSAGA_BROWSER_ARTIFACTS (a new temporary folder when unset) and logs
// their paths. Without Chromium it skips, saying how to install it.
package browser

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/sim"
)

// ArtifactsEnv names the folder the screenshots are saved in.
const ArtifactsEnv = "TRIPSAGA_BROWSER_ARTIFACTS"

// RequireChromiumEnv names the environment variable that turns a missing
// Chromium from a skip into a failure; .ci/run sets it (CI installs
// Chromium: there the browser test must run, never be skipped).
const RequireChromiumEnv = "TRIPSAGA_REQUIRE_CHROMIUM"

const token = "browser-test-operator-token"

// chromium finds the browser: $CHROMIUM, else chromium, chromium-browser,
// google-chrome on PATH.
func chromium() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

func artifacts(t *testing.T) string {
	dir := os.Getenv(ArtifactsEnv)
	if dir == "" {
		var err error
		dir, err = os.MkdirTemp("", "tripsaga-browser-")
		require.NoError(t, err)
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// startSystem builds the binary and starts the whole system with the
// operator token, quick sweeps and a short stuck threshold.
func startSystem(t *testing.T) (*stack.Stack, string, string) {
	t.Helper()
	dir := t.TempDir()
	// Searchable, so the postgres OS user (run as root) reaches the
	// private cluster below it.
	require.NoError(t, os.Chmod(dir, 0o711))
	bin := filepath.Join(dir, "tripsaga")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/tripsaga")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	require.NoError(t, build.Run())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stackDir := filepath.Join(dir, "stack")
	sys, err := stack.Start(ctx, stack.Config{Dir: stackDir, Binary: bin, Env: []string{
		"OPERATOR_TOKEN=" + token,
		"RECONCILE_INTERVAL_MS=1000", "STUCK_AFTER_MS=3000",
		// Undo attempts back off to a minute, so a retry asked by a
		// person is what ends the trip once the fault is gone.
		"INCIDENT_AFTER=3", "UNDO_BACKOFF_MAX_MS=60000",
	}})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range stack.Processes {
				b, _ := os.ReadFile(sys.LogPath(name))
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("==== %s log (tail)\n%s", name, b)
			}
		}
		sys.Stop()
	})
	return sys, bin, stackDir
}

// postTrip asks for a trip and returns its id; prefer, when given, is
// the request's Prefer header ("wait=0": answer at once).
func postTrip(t *testing.T, tripsURL string, req events.TripRequest, prefer ...string) string {
	t.Helper()
	body, err := json.Marshal(req)
	require.NoError(t, err)
	hr, err := http.NewRequest(http.MethodPost, tripsURL+"/trips", bytes.NewReader(body))
	require.NoError(t, err)
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Idempotency-Key", "browser-"+req.Payment.CardToken)
	for _, p := range prefer {
		hr.Header.Add("Prefer", p)
	}
	resp, err := http.DefaultClient.Do(hr)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, resp.StatusCode, string(raw))
	var tr struct {
		TripID string `json:"trip_id"`
	}
	require.NoError(t, json.Unmarshal(raw, &tr))
	return tr.TripID
}

// TestConsoleInBrowser: the card processor's refunds fail for one trip
// whose car is sold out. In the browser the operator finds it on the
// dashboard as a stuck finding, opens its timeline (compensation stuck,
// an open incident), and once the fault is gone asks for "retry now" with
// the operator token; the action appears on the timeline, and the trip
// ends canceled with its refund. `tripsaga timeline` prints the same trip.
func TestConsoleInBrowser(t *testing.T) {
	browser := chromium()
	if browser == "" {
		msg := "Chromium not found: install Debian's chromium package (apt-get install chromium), or set CHROMIUM to a Chrome or Chromium binary, to run the browser test"
		if os.Getenv(RequireChromiumEnv) != "" {
			t.Fatal(msg + " ($" + RequireChromiumEnv + " is set)")
		}
		t.Log("SKIPPED (NOT RUN): " + msg)
		t.Skip(msg)
	}
	shots := artifacts(t)
	sys, bin, stackDir := startSystem(t)
	companies := sys.CompanyURLs()
	base := sys.URL("reconciler")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// The trip: its car is sold out, and its refund fails until we lift
	// the rule.
	nonce := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000_000)
	email := "refund-fails+" + nonce + "@example.com"
	card := "tok_refundfails_" + nonce
	require.NoError(t, sim.AddFault(ctx, companies["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut, Match: map[string]string{"driver.email": email}}))
	refundRule, err := sim.AddFaultRule(ctx, companies["PAYMENTS_URL"], sim.Rule{Op: sim.OpRefund, Fault: sim.FaultFail, Match: map[string]string{"card_token": card}})
	require.NoError(t, err)
	in := time.Now().AddDate(0, 0, 30)
	trip := postTrip(t, sys.URL("trips"), events.TripRequest{
		Traveler: events.Person{Name: "Ada Example", Email: email},
		Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: in.Format(time.DateOnly), Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: in.Format(time.DateOnly), Return: in.AddDate(0, 0, 2).Format(time.DateOnly)},
		Payment:  events.PaymentRequest{CardToken: card, AmountCents: 33000, Currency: "USD"},
	})
	t.Logf("trip %s (traveler %s)", trip, email)
	// A few trips that go well, for the figures and the chart.
	for i := range 8 {
		ok := "ok-" + nonce + "-" + fmt.Sprint(i)
		postTrip(t, sys.URL("trips"), events.TripRequest{
			Traveler: events.Person{Name: "Grace Example", Email: ok + "@example.com"},
			Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: in.Format(time.DateOnly), Nights: 1},
			Car:      events.CarRequest{CarClass: "compact", Pickup: in.Format(time.DateOnly), Return: in.AddDate(0, 0, 1).Format(time.DateOnly)},
			Payment:  events.PaymentRequest{CardToken: "tok_" + strings.ReplaceAll(ok, "-", "_"), AmountCents: 12000, Currency: "USD"},
		})
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 1000), chromedp.Flag("disable-gpu", true))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()

	var saved []string
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		p := filepath.Join(shots, name+".png")
		require.NoError(t, os.WriteFile(p, png, 0o644))
		saved = append(saved, p)
		t.Logf("screenshot: %s", p)
	}
	// until loads u until the JavaScript expression cond is true in it,
	// bounded by ctx: the server renders each page from the system's
	// state, so a new load is a new look.
	until := func(u, cond, what string) {
		t.Helper()
		for {
			err := chromedp.Do(bctx, chromedp.Navigate(u))
			// The timeline reloads itself 700 ms after an accepted action
			// (console.go): a load of ours racing that reload is aborted
			// (net::ERR_ABORTED) and is simply made again.
			aborted := err != nil && strings.Contains(err.Error(), "net::ERR_ABORTED")
			if !aborted {
				require.NoError(t, err, what)
				ok, err := chromedp.Run(bctx, chromedp.Evaluate[bool](cond))
				// The same reload may destroy the page under the
				// expression ("Execution context was destroyed").
				if err != nil && !strings.Contains(err.Error(), "context") {
					require.NoError(t, err, what)
				}
				if ok {
					return
				}
			}
			select {
			case <-ctx.Done():
				text, _ := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("body")))
				t.Fatalf("%s: never seen; the page says:\n%s", what, text)
			case <-time.After(500 * time.Millisecond):
			}
		}
	}

	// 1. The dashboard shows the trip as an open undo: its refund fails,
	// the hotel's release went on past it (issue 22), the charge is open.
	until(base+"/", fmt.Sprintf(`[...document.querySelectorAll("td.open_undo")].some(td => td.parentElement.textContent.includes(%q))`, trip),
		"the trip as an open_undo finding on the dashboard")
	shot("1-dashboard-stuck")

	// 2. Search by the traveler's email opens the trip's timeline.
	require.NoError(t, chromedp.Do(bctx,
		chromedp.SetValue(chromedp.CSS("#q"), email),
		chromedp.Click(chromedp.CSS("#search")),
		chromedp.WaitVisible(chromedp.CSS("#trip-id"))))
	shown, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#trip-id")))
	require.NoError(t, err)
	require.Equal(t, trip, shown, "the search by email opens the trip")
	timeline := base + "/trips/" + trip
	until(timeline, `document.querySelector("#stopped").textContent.includes("open incident at payment: compensation_stuck")`,
		"the open incident on the timeline")
	stopped, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#stopped")))
	require.NoError(t, err)
	require.Contains(t, stopped, "canceling, not settled")
	shot("2-timeline-stuck")

	// 3. The incidents page lists it with its attempts.
	until(base+"/incidents", fmt.Sprintf(`[...document.querySelectorAll("#incidents tr.open")].some(tr => tr.textContent.includes(%q))`, trip),
		"the incident on the incidents page")
	shot("3-incidents")

	// 4. The fault is fixed; the operator asks for "retry now" with the
	// token and a reason.
	_, err = sim.RemoveFault(ctx, companies["PAYMENTS_URL"], refundRule.ID)
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(timeline),
		chromedp.SetValue(chromedp.CSS("#operator"), "ada"),
		chromedp.SetValue(chromedp.CSS("#token"), token),
		chromedp.SetValue(chromedp.CSS("#reason"), "the card processor's refunds work again"),
		chromedp.Click(chromedp.CSS("button.retry")),
		chromedp.WaitVisible(chromedp.CSS(`#action-result[data-status]`))))
	answer, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#action-result")))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(answer, "202 "), "the action's answer: %s", answer)
	require.Contains(t, answer, "retry_undo")

	// 5. The action is on the timeline, in the operator's column, and the
	// trip ends canceled with its refund.
	until(timeline, `[...document.querySelectorAll('#timeline tr.entry[data-column="operator"]')].some(tr => tr.textContent.includes("retry_undo") && tr.textContent.includes("ada"))`,
		"the operator's action on the timeline")
	until(timeline, `document.querySelector("#stopped").textContent.includes("settled: canceled")`, "the trip settled canceled")
	records, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#records")))
	require.NoError(t, err)
	require.Contains(t, records, "refunded")
	require.Contains(t, records, "released")
	shot("4-timeline-settled")
	until(base+"/", `document.querySelector("#chart") !== null`, "the chart")
	shot("5-dashboard")

	// The search finds the trip by its POST's Idempotency-Key too.
	resp, err := http.Get(base + "/api/search?q=browser-" + card)
	require.NoError(t, err)
	var hits struct {
		Items []struct {
			TripID  string `json:"trip_id"`
			Matched string `json:"matched"`
		} `json:"items"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&hits))
	resp.Body.Close()
	require.Len(t, hits.Items, 1)
	require.Equal(t, trip, hits.Items[0].TripID)
	require.Equal(t, "Idempotency-Key", hits.Items[0].Matched)

	// `tripsaga timeline` shows the same story.
	out, err := exec.CommandContext(ctx, bin, "timeline", "--dir", stackDir, email).CombinedOutput()
	require.NoError(t, err, string(out))
	for _, want := range []string{"trip " + trip + ": canceled", "trip.requested", "car.rejected", "operator.action", "retry_undo carried out", "payment.refunded", "trip.canceled", "refunded"} {
		require.Contains(t, string(out), want)
	}
	t.Logf("tripsaga timeline %s:\n%s", trip, out)

	// 6. A refund outage hits 40 trips (their cars sold out, so each is
	// undone, and the card processor's refunds fail): the operator finds
	// them in the trip list by the step they wait on.
	const outage = 40
	require.NoError(t, sim.AddFault(ctx, companies["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut, Match: map[string]string{"car_class": "van"}}))
	outageRule, err := sim.AddFaultRule(ctx, companies["PAYMENTS_URL"], sim.Rule{Op: sim.OpRefund, Fault: sim.FaultFail, Match: map[string]string{"amount_cents": "41000"}})
	require.NoError(t, err)
	var hit []string
	for i := range outage {
		o := fmt.Sprintf("outage-%s-%d", nonce, i)
		hit = append(hit, postTrip(t, sys.URL("trips"), events.TripRequest{
			Traveler: events.Person{Name: "Outage Example", Email: o + "@example.com"},
			Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: in.Format(time.DateOnly), Nights: 1},
			Car:      events.CarRequest{CarClass: "van", Pickup: in.Format(time.DateOnly), Return: in.AddDate(0, 0, 1).Format(time.DateOnly)},
			Payment:  events.PaymentRequest{CardToken: "tok_" + strings.ReplaceAll(o, "-", "_"), AmountCents: 41000, Currency: "USD"},
		}, "wait=0")) // they will not settle while the outage lasts
	}
	list := base + "/trips?state=compensating&company=payment&order=oldest&limit=50"
	until(list, fmt.Sprintf(`document.querySelector("#match-count").textContent.trim() === "%d"`, outage),
		"the 40 trips of the outage in the trip list, waiting on their refunds")
	rows, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#trips tr.trip").length`))
	require.NoError(t, err)
	require.Equal(t, outage, rows)
	shot("6-trips-refund-outage")

	// bulkRun fills the trip list's bulk form at list for action, dry-runs
	// it (the count and a sample, nothing recorded; shot as dryShot when
	// set), runs it on that count and follows its page to the end; it
	// returns the bulk action's id.
	bulkRun := func(action, rate, canary, reason, dryShot, endShot string) string {
		t.Helper()
		until(list, fmt.Sprintf(`document.querySelector("#match-count").textContent.trim() === "%d"`, outage), "the outage's trips in the list")
		require.NoError(t, chromedp.Do(bctx,
			chromedp.SetValue(chromedp.CSS("#b-action"), action),
			chromedp.SetValue(chromedp.CSS("#b-rate"), rate),
			chromedp.SetValue(chromedp.CSS("#b-canary"), canary),
			chromedp.SetValue(chromedp.CSS("#operator"), "ada"),
			chromedp.SetValue(chromedp.CSS("#token"), token),
			chromedp.SetValue(chromedp.CSS("#reason"), reason),
			chromedp.Click(chromedp.CSS("#b-dry")),
			chromedp.WaitVisible(chromedp.CSS("#dry-count"))))
		dryText, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#dry-count")))
		require.NoError(t, err)
		require.Contains(t, dryText, fmt.Sprintf("%d trips would get %s (payment %d)", outage, action, outage))
		t.Logf("dry run: %s", dryText)
		if dryShot != "" {
			shot(dryShot)
		}
		// Either the bulk action's page opens or the form says why not.
		require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#b-run"))))
		var bulkID string
		for bulkID == "" {
			// The page navigates away under the expression when it
			// works: such an error is a look made again.
			got, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector("#bulk-id") ? document.querySelector("#bulk-id").textContent :
				(document.querySelector("#bulk-result") && document.querySelector("#bulk-result").dataset.status ? "not started: " + document.querySelector("#bulk-result").textContent : "")`))
			if err != nil && !strings.Contains(err.Error(), "navigated") && !strings.Contains(err.Error(), "context") && !strings.Contains(err.Error(), "null") {
				require.NoError(t, err)
			}
			bulkID = got
			select {
			case <-ctx.Done():
				t.Fatal("the bulk action's page never opened")
			case <-time.After(200 * time.Millisecond):
			}
		}
		require.True(t, strings.HasPrefix(bulkID, "B-"), bulkID)
		until(base+"/bulk/"+bulkID, `document.querySelector("#bulk-state").dataset.ended === "true"`, "the end of bulk action "+bulkID)
		state, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#bulk-state")))
		require.NoError(t, err)
		require.Equal(t, "done", state)
		shot(endShot)
		return bulkID
	}

	// 7. While the outage lasts, the operator pauses the 40 trips' calls
	// (no retry hammers the card processor meanwhile, and the set stays
	// still).
	paused := bulkRun("pause", "20", "0", "the card processor's refunds are down", "", "7-bulk-pause-done")
	until(list+"&paused=true", fmt.Sprintf(`document.querySelector("#match-count").textContent.trim() === "%d"`, outage),
		"the 40 trips listed as paused (the services' step logs, read by the next sweep)")

	// 8. The outage ends; a bulk retry (10 a second, a canary of 5) makes
	// every refund due now and lifts the pause; its page follows it to
	// the end.
	_, err = sim.RemoveFault(ctx, companies["PAYMENTS_URL"], outageRule.ID)
	require.NoError(t, err)
	bulkID := bulkRun("retry_undo", "10", "5", "the card processor's refunds work again", "8-bulk-retry-dry-run", "9-bulk-retry-done")
	t.Logf("bulk actions: pause %s, retry %s", paused, bulkID)

	// Its audit: one record of the bulk action, one action per trip
	// sent, every trip of the outage ends canceled with its refund.
	var bulk struct {
		Trips    int            `json:"trips"`
		Operator string         `json:"operator"`
		Reason   string         `json:"reason"`
		Canary   int            `json:"canary"`
		RatePerS float64        `json:"rate_per_s"`
		Counts   map[string]int `json:"counts"`
		Items    []struct {
			TripID  string `json:"trip_id"`
			EventID string `json:"event_id"`
		} `json:"items"`
	}
	getJSON(t, base+"/api/bulk-actions/"+bulkID, &bulk)
	require.Equal(t, outage, bulk.Trips)
	require.Equal(t, "ada", bulk.Operator)
	require.Equal(t, 5, bulk.Canary)
	require.Equal(t, map[string]int{"done": outage}, bulk.Counts, "every retry made a refund due: the pause kept them all waiting")
	var sentIDs []string
	for _, it := range bulk.Items {
		if it.EventID != "" {
			sentIDs = append(sentIDs, it.EventID)
		}
	}
	var actions struct {
		Items []json.RawMessage `json:"items"`
	}
	getJSON(t, base+"/api/actions?limit=1000", &actions)
	recorded := 0
	for _, raw := range actions.Items {
		if strings.Contains(string(raw), "bulk action "+bulkID+": the card processor") {
			recorded++
		}
	}
	require.Equal(t, len(sentIDs), recorded, "one recorded action per trip sent")
	for _, trip := range hit {
		until(base+"/trips/"+trip, `document.querySelector("#stopped").textContent.includes("settled: canceled")`, "trip "+trip+" canceled")
	}
	t.Logf("bulk action %s: %d trips, counts %v, %d actions recorded", bulkID, bulk.Trips, bulk.Counts, recorded)

	// 10. A re-drive from a step, dry run: what would be handed to whom.
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(base+"/trips/"+hit[0]),
		chromedp.SetValue(chromedp.CSS("#redrive-step"), "payment"),
		chromedp.Click(chromedp.CSS("button.redrive-dry")),
		chromedp.WaitVisible(chromedp.CSS(`#redrive-result[data-status="200"]`))))
	plan, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#redrive-result")))
	require.NoError(t, err)
	require.Contains(t, plan, "dry run: ")
	require.Contains(t, plan, "hotel.held → payment", "the event that made the payment step run, to payment")
	t.Logf("re-drive dry run: %s", plan)
	t.Logf("screenshots:\n%s", strings.Join(saved, "\n"))
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, u)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}
