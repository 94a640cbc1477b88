package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
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

// bin is the tripsaga binary TestMain built.
var bin string

// Scenarios of a fault point row's trip.
const (
	happy      = "happy"        // confirmed: whole
	carSoldOut = "car sold out" // the car is sold out: refund, release; canceled: empty
	carHangs   = "car hangs"    // the car never answers: canceled by key at the deadline, refund, release
)

// faultRow arms one rule at one point and books one trip of a scenario
// that reaches it.
type faultRow struct {
	point, action, scenario string
}

// faultSteps is the STEPS TestFaultPoints runs with: the environment's
// when it sets one, else every step (the optional insurance too), so one
// run covers the three-step points and the insurance's.
func faultSteps() string {
	if v := os.Getenv(events.StepsVar); v != "" {
		return v
	}
	return "hotel,insurance,payment,car"
}

// faultRows is the table: every point of internal/fault with kill, on a
// trip that reaches it, and a few rows with error and delay; the points
// of a service the steps do not run (insurance with three steps) are left
// out.
func faultRows(steps string) []faultRow {
	cat, err := events.ParseSteps(steps)
	if err != nil {
		panic(err) // TestFaultPoints checks steps first
	}
	runs := func(p string) bool {
		return fault.Process(p) == "reconciler" || slices.Contains(cat.Services(), fault.Process(p))
	}
	var rows []faultRow
	for _, p := range fault.Points {
		if strings.Contains(p, ".traveler_") || !runs(p) {
			continue // the traveler's cancellation: TestCancellationFaults
		}
		if strings.Contains(p, ".notice_mail.") || strings.Contains(p, ".correction_mail.") {
			continue // no booking reaches them: TestTravelerMails
		}
		if strings.Contains(p, ".replay.") {
			continue // a tool's, not a booking's: TestReplayKilledAfterItsClear
		}
		sc := happy
		switch {
		case strings.HasPrefix(p, "hotel.release.") || strings.HasPrefix(p, "payment.refund.") || strings.HasPrefix(p, "insurance.cancel."):
			sc = carSoldOut
		case strings.HasPrefix(p, "car.cancel."):
			sc = carHangs
		}
		rows = append(rows, faultRow{p, fault.Kill, sc})
	}
	rows = append(rows,
		faultRow{fault.HotelHoldBeforeCall, fault.Error, happy},            // the call fails unsent: unknown, asked by key, made
		faultRow{fault.CarBookAfterCall, fault.Error, happy},               // the answer is not recorded: the lease ends, asked again by key
		faultRow{fault.PaymentRefundAnswerUnread, fault.Error, carSoldOut}, // refunded, answer unread: learned by key
		faultRow{fault.HotelReleaseAfterLog, fault.Error, carSoldOut},      // released and logged, not published at once: a relay claims it
		faultRow{fault.TripsRelayAfterPublish, fault.Error, happy},         // published, not marked: re-published, deduplicated
		faultRow{fault.PaymentInboxAfterCommit, fault.Error, happy},        // committed, ack lost: redelivered, a duplicate
		faultRow{fault.CarBookAnswerUnread, "delay=3s", happy},             // longer than the call's deadline: unknown, learned by key
		faultRow{fault.HotelReleaseAfterCall, "delay=1s", carSoldOut},      // slow, nothing fails
	)
	if runs(fault.InsuranceBuyBeforeCall) {
		rows = append(rows,
			faultRow{fault.InsuranceBuyAfterCall, fault.Error, happy},            // bought, not recorded: the lease ends, learned by key
			faultRow{fault.InsuranceCancelAnswerUnread, fault.Error, carSoldOut}, // canceled, answer unread: learned by key
		)
	}
	return rows
}

// faultRig is the stack the fault point rows share: its children read
// their rules from one file, rewritten as rows arm and disarm them.
type faultRig struct {
	s        *stack.Stack
	rules    string // TRIPSAGA_FAULTS_FILE
	markers  string // TRIPSAGA_FAULTS_DIR
	nonce    string
	http     *http.Client
	mu       sync.Mutex
	armed    map[string]string // once name -> rule
	scenario map[string]string // trip id -> scenario
	card     map[string]string // trip id -> card token
}

func (g *faultRig) arm(t *testing.T, name, rule string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rule == "" {
		delete(g.armed, name)
	} else {
		g.armed[name] = rule
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(g.armed)) {
		b.WriteString(g.armed[k] + "\n")
	}
	tmp := g.rules + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(b.String()), 0o644))
	require.NoError(t, os.Rename(tmp, g.rules))
}

// book posts one trip of the scenario (its company faults set first) and
// returns its id at once (Prefer: wait=0).
func (g *faultRig) book(t *testing.T, tag, scenario string) string {
	ctx := context.Background()
	email := tag + "+" + g.nonce + "@example.com"
	card := "tok_" + tag + "_" + g.nonce
	urls := g.s.CompanyURLs()
	switch scenario {
	case carSoldOut:
		require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut, Match: map[string]string{"driver.email": email}}))
	case carHangs:
		require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultHang, DelayMS: 60000, Match: map[string]string{"driver.email": email}}))
	}
	in := time.Now().UTC().AddDate(0, 0, 30)
	req := events.TripRequest{
		Traveler: events.Person{Name: "Ada Example", Email: email},
		Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: in.Format(time.DateOnly), Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: in.Format(time.DateOnly), Return: in.AddDate(0, 0, 2).Format(time.DateOnly)},
		Payment:  events.PaymentRequest{CardToken: card, AmountCents: 33000, Currency: "USD"},
	}
	body, err := json.Marshal(req)
	require.NoError(t, err)
	// Another lane may kill trips while this POST is in flight (its rows
	// do so on purpose): send it again with the same Idempotency-Key, as a
	// client would, until the restarted process answers.
	var resp *http.Response
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		hr, err := http.NewRequest(http.MethodPost, g.s.URL("trips")+"/trips", bytes.NewReader(body))
		require.NoError(t, err)
		hr.Header.Set("Prefer", "wait=0")
		hr.Header.Set("Idempotency-Key", "fp-"+tag+"-"+g.nonce)
		resp, err = g.http.Do(hr)
		if err == nil || time.Now().After(deadline) {
			require.NoError(t, err)
			break
		}
	}
	defer resp.Body.Close()
	var out struct {
		TripID string `json:"trip_id"`
	}
	raw, _ := io.ReadAll(resp.Body)
	require.Contains(t, []int{201, 202}, resp.StatusCode, "%s", raw)
	require.NoError(t, json.Unmarshal(raw, &out))
	g.mu.Lock()
	g.scenario[out.TripID], g.card[out.TripID] = scenario, card
	g.mu.Unlock()
	return out.TripID
}

func (g *faultRig) getJSON(u string, v any) int {
	resp, err := g.http.Get(u)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(v)
	return resp.StatusCode
}

// outcome is what a trip ended as.
type outcome struct{ demo.TripOutcome }

func (o outcome) summary() string {
	s := fmt.Sprintf("%s %s; hold %s; charge %s (%d charge/%d refund lines); car %s; %d mail", o.Status, o.Verdict, o.Hold, o.Charge, o.Charges, o.Refunds, o.Booking, o.Mails)
	if o.Policy != "" {
		s += "; policy " + o.Policy
	}
	return s
}

// judge waits for the trip to settle and for its mail, and judges it from
// the companies' own records (demo.Verdict).
func (g *faultRig) judge(t *testing.T, id string) outcome {
	t.Helper()
	out := outcome{demo.TripOutcome{TripID: id}}
	// A bound, not a figure: after a kill the trip waits for the restart,
	// the recovery pass and its backoffs, which on a host busy with the
	// rest of the suite (load 70 in CI) took more than 90 s.
	wait(t, 5*time.Minute, func() bool {
		var tr struct {
			Status string `json:"status"`
			Reason string `json:"reason"`
		}
		g.getJSON(g.s.URL("trips")+"/trips/"+id, &tr)
		out.Status, out.Reason = tr.Status, tr.Reason
		return tr.Status == "confirmed" || tr.Status == "canceled"
	}, "trip %s settles", id)
	urls := g.s.CompanyURLs()
	status := func(base, res, key string) string {
		var v struct {
			Status string `json:"status"`
		}
		if g.getJSON(base+"/"+res+"/"+url.PathEscape(key), &v) == http.StatusNotFound {
			return "none"
		}
		return v.Status
	}
	out.Hold = status(urls["HOTEL_URL"], "holds", id+":hotel")
	out.Charge = status(urls["PAYMENTS_URL"], "charges", id+":charge")
	out.Booking = status(urls["CARS_URL"], "bookings", id+":car")
	if base, ok := urls["INSURER_URL"]; ok {
		out.Policy = status(base, "policies", id+":insurance") // demo.Verdict judges it too
	}
	g.mu.Lock()
	card := g.card[id]
	g.mu.Unlock()
	var st struct {
		Lines []struct {
			TripID string `json:"trip_id"`
			Kind   string `json:"kind"`
		} `json:"lines"`
	}
	g.getJSON(urls["PAYMENTS_URL"]+"/statements/"+url.PathEscape(card), &st)
	for _, l := range st.Lines {
		switch {
		case l.TripID != id:
		case l.Kind == "charge":
			out.Charges++
		case l.Kind == "refund":
			out.Refunds++
		}
	}
	// The mail is sent after the trip settles, retried forward. Mails
	// counts the final ones (confirmation or cancellation); a delay notice
	// or a correction is counted beside it.
	wait(t, 60*time.Second, func() bool {
		var m struct {
			Items []struct {
				Key string `json:"key"`
			} `json:"items"`
		}
		g.getJSON(urls["MAIL_URL"]+"/messages?trip_id="+url.QueryEscape(id), &m)
		var keys []string
		for _, it := range m.Items {
			keys = append(keys, it.Key)
		}
		out.Mails, out.Notices, out.Corrections = demo.CountMails(keys)
		return out.Mails > 0
	}, "trip %s is mailed", id)
	out.Verdict = demo.Verdict(out.TripOutcome)
	return out
}

// wait polls cond every 50 ms until it holds or the bound (which only
// stops a hung test) passes, then fails the test.
func wait(t *testing.T, bound time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: "+msg, args...)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// marker reads a fired rule's marker file: its fields (rule, point, pid,
// trip_id, at).
func marker(path string) map[string]string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	m := map[string]string{}
	for f := range strings.FieldsSeq(string(b)) {
		if k, v, ok := strings.Cut(f, "="); ok && m[k] == "" {
			m[k] = v
		}
	}
	return m
}

// TestFaultPoints (issue 6, item 3) runs every fault point of
// internal/fault with real child processes on a stack of its own whose
// processes read their rules from a file: each row arms its rule
// (once=<row>), books a trip that reaches the point, and checks that the
// fault fired (its once marker, the process's log line) and, for kill,
// that the process died there and was restarted by the supervisor (its
// pid changed, it is ready again); then the trip it fired for, and the
// row's own trip, end right, judged from the companies' own records
// (demo.Verdict, the insurer's policy included): whole when confirmed
// (the policy active), empty when canceled (no policy in force; always
// canceled for a car sold out or hanging; a trip whose steps outlived
// their deadline while processes restarted is canceled too, which is just
// as right), never HALF, with one charge line at most and one mail. Rows
// of one process run one after the other, their compensations in a lane
// of their own, the lanes side by side (car's cancel rows each in its own:
// their trips wait for the car's deadline). The stack's STEP_DEADLINE_MS
// is 20 s so that most trips outlive the kills and are confirmed.
//
// It runs with four steps (faultSteps: STEPS=hotel,insurance,payment,car
// unless the environment names others), so the insurance rows fire too:
// its buy on every trip, its cancel on a car sold out (refund, cancel,
// release). The three-step points are all in the table and fire on the
// same trips; a run with STEPS=hotel,payment,car leaves the insurance rows
// out.
func TestFaultPoints(t *testing.T) {
	// Its own stack: it runs beside the other tests that have one.
	t.Parallel()
	require.NotEmpty(t, bin, "TestMain builds the binary")
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o711))
	g := &faultRig{
		rules: filepath.Join(dir, "faults.rules"), markers: filepath.Join(dir, "markers"),
		nonce: strconv.FormatInt(time.Now().UnixNano()%1e9, 36), http: &http.Client{Timeout: 60 * time.Second},
		armed: map[string]string{}, scenario: map[string]string{}, card: map[string]string{},
	}
	require.NoError(t, os.MkdirAll(g.markers, 0o755))
	steps := faultSteps()
	_, err := events.ParseSteps(steps)
	require.NoError(t, err, "STEPS")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	g.s, err = stack.Start(ctx, stack.Config{Dir: filepath.Join(dir, "stack"), Binary: bin, Env: []string{
		fault.EnvFile + "=" + g.rules, fault.EnvDir + "=" + g.markers,
		// Long enough for a trip to outlive a few restarts of one
		// process (two lanes kill car) and still be confirmed.
		"STEP_DEADLINE_MS=20000",
		events.StepsVar + "=" + steps,
	}})
	require.NoError(t, err)
	defer g.s.Stop()
	t.Logf("stack up in %s (STEPS=%s)", time.Since(start).Round(time.Millisecond), steps)
	defer func() {
		if t.Failed() {
			for _, name := range g.s.Instances() {
				b, _ := os.ReadFile(g.s.LogPath(name))
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("==== %s log (tail)\n%s", name, b)
			}
		}
	}()

	rows := faultRows(steps)
	lanes := map[string][]int{}
	for i, r := range rows {
		lane := fault.Process(r.point)
		switch r.scenario {
		case carSoldOut:
			lane += " (undo)"
		case carHangs: // each waits for the car's deadline: side by side
			lane = r.point
		}
		lanes[lane] = append(lanes[lane], i)
	}
	// up is when each process was last seen restarted: a process that dies
	// within 5 s of its start is restarted later and later by the
	// supervisor, so a lane lets its process live 5 s before the next kill.
	var upMu sync.Mutex
	up := map[string]time.Time{}
	// The lanes run side by side in goroutines (t.Parallel would run only
	// GOMAXPROCS of them at once).
	var lanesDone sync.WaitGroup
	for lane, idx := range lanes {
		lanesDone.Go(func() {
			t.Run(lane, func(t *testing.T) {
				for _, i := range idx {
					r := rows[i]
					name := fmt.Sprintf("row%02d", i)
					t.Run(fmt.Sprintf("%s:%s", r.point, r.action), func(t *testing.T) {
						g.row(t, r, name, &upMu, up)
					})
				}
			})
		})
	}
	lanesDone.Wait()
	t.Logf("%d rows in %s", len(rows), time.Since(start).Round(time.Millisecond))

	// Every trip booked, whichever rule fired on it, ended right.
	g.mu.Lock()
	all := slices.Sorted(maps.Keys(g.scenario))
	g.mu.Unlock()
	verdicts := map[string]int{}
	for _, id := range all {
		o := g.judge(t, id)
		g.mu.Lock()
		verdicts[g.scenario[id]+" "+o.Status+" "+o.Verdict]++
		g.mu.Unlock()
		require.NotEqual(t, demo.Half, o.Verdict, "trip %s: %s", id, o.summary())
		require.Equal(t, 1, o.Mails, "trip %s: %s", id, o.summary())
	}
	t.Logf("%d trips: %v", len(all), verdicts)
}

// row runs one row of the table (see TestFaultPoints).
func (g *faultRig) row(t *testing.T, r faultRow, name string, upMu *sync.Mutex, up map[string]time.Time) {
	proc := fault.Process(r.point)
	if r.action == fault.Kill && r.scenario != carHangs {
		upMu.Lock()
		since := up[proc]
		upMu.Unlock()
		if d := 5*time.Second - time.Since(since); d > 0 {
			time.Sleep(d) // not an assertion: the supervisor's restart backoff
		}
	}
	rule := r.point + ":" + r.action + ":once=" + name
	g.arm(t, name, rule)
	defer g.arm(t, name, "")
	own := g.book(t, name, r.scenario)
	path := fault.Marker(g.markers, name)
	wait(t, 90*time.Second, func() bool { _, err := os.Stat(path); return err == nil }, "%s fires (trip %s)", rule, own)
	var m map[string]string
	wait(t, 5*time.Second, func() bool { m = marker(path); return m["pid"] != "" }, "marker %s is written", path)
	pid, trip := m["pid"], m["trip_id"]
	wait(t, 30*time.Second, func() bool {
		b, _ := os.ReadFile(g.s.LogPath(proc))
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.Contains(line, `msg="fault fired" point=`+r.point+" ") && strings.HasSuffix(strings.TrimSpace(line), " pid="+pid) && strings.Contains(line, "once="+name) {
				return true
			}
		}
		return false
	}, "%s's log says %s fired in pid %s", proc, rule, pid)
	if r.action == fault.Kill {
		wait(t, 60*time.Second, func() bool { return strconv.Itoa(g.s.Pid(proc)) != pid }, "%s (pid %s) is restarted", proc, pid)
		require.NoError(t, g.s.WaitReady(context.Background(), proc))
		upMu.Lock()
		up[proc] = time.Now()
		upMu.Unlock()
	}
	trips := []string{own}
	if trip != "" && trip != own && strings.HasPrefix(trip, "T-") {
		trips = append(trips, trip)
	}
	for _, id := range trips {
		o := g.judge(t, id)
		g.mu.Lock()
		sc, known := g.scenario[id]
		g.mu.Unlock()
		// A trip whose car is sold out or hangs cannot be confirmed; any
		// other trip ends confirmed, or canceled when its steps outlived
		// their deadline while processes restarted: both are right.
		want := []string{"confirmed", "canceled"}
		if sc == carSoldOut || sc == carHangs {
			want = want[1:]
		}
		b := o.summary()
		t.Logf("%s fired in pid %s for %s; trip %s (%s): %s", rule, pid, trip, id, sc, b)
		require.NotEqual(t, demo.Half, o.Verdict, "trip %s is whole or empty: %s", id, b)
		if known {
			require.Contains(t, want, o.Status, "trip %s (%s)", id, sc)
		}
		require.LessOrEqual(t, o.Charges, 1, "one charge at most: %s", b)
		require.LessOrEqual(t, o.Refunds, 1, "one refund at most: %s", b)
		require.Equal(t, 1, o.Mails, "one mail: %s", b)
	}
}
