package reconciler

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/saga"
)

// openStepsHandler adds GET /steps?open=1 to a fake service: its step
// rows whose status is not final.
func (f *fakeService) openStepsHandler(next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", next)
	mux.HandleFunc("GET /steps", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		items := []saga.OpenStep{}
		for trip, rows := range f.steps {
			for _, s := range rows {
				if slices.Contains(openStates, s.Status) {
					items = append(items, saga.OpenStep{TripID: trip, Step: s.Step, Status: s.Status, Attempts: s.Attempts,
						UndoAttempts: s.UndoAttempts, LastError: s.LastError, Since: s.CreatedAt, Paused: f.paused[trip]})
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items, "last": true})
	})
	return mux
}

// addTrip puts a trip into the projection, first seen age ago.
func (b *bundle) addTrip(t *testing.T, trip, status string, age time.Duration) {
	t.Helper()
	at := time.Now().Add(-age)
	_, err := b.pool.Exec(context.Background(), `INSERT INTO trip_view (trip_id, seen, status, requested, events, first_event_at, last_event_at, version)
		VALUES ($1, '{trip.requested}', $2, true, 1, $3, $3, 'hotel,payment,car')`, trip, status, at)
	require.NoError(t, err)
}

type bulkClient struct {
	t    *testing.T
	base string
}

func (c bulkClient) do(method, path, key string, body, out any) int {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(c.t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	require.NoError(c.t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	if out != nil {
		require.NoError(c.t, json.Unmarshal(raw, out), string(raw))
	}
	return resp.StatusCode
}

// carryOut plays the payment service until bulk action id ends: every
// sent trip's action is reported with effect(trip). It returns the bulk
// action as it ended.
func carryOut(t *testing.T, op *Operator, pay *fakeService, id string, effect func(trip string) string) BulkAction {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reported := map[string]bool{}
	for {
		b, err := op.Bulk(ctx, id, 1000)
		require.NoError(t, err)
		if b.Ended() {
			return b
		}
		for _, it := range b.Items {
			if it.State == BulkTripSent && !reported[it.TripID] {
				pay.report(it.TripID, it.EventID, effect(it.TripID))
				reported[it.TripID] = true
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("bulk action %s never ended: %+v", id, b)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// The trip list finds trips by their open step (as the sweep read the
// services' step logs), state, attempts, last error, finding and age, a
// page at a time; a bulk retry of the 6 stuck refunds takes exactly the
// dry run's count, sends the canary first, keeps the rate limit, records
// one audit row for itself and one action per trip, and acts once
// however often it is asked.
func TestTripListAndBulkActions(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	pay := &fakeService{steps: map[string][]saga.StepView{}, effects: map[string]saga.OperatorEntry{}, paused: map[string]bool{"T-REFUND-5": true}}
	var stuck []string
	for i := range 6 {
		trip := fmt.Sprintf("T-REFUND-%d", i)
		stuck = append(stuck, trip)
		pay.steps[trip] = []saga.StepView{{TripID: trip, Step: "payment", Status: "compensating", UndoAttempts: 3 + i,
			LastError: "refund: 503 Service Unavailable", CreatedAt: now}}
	}
	pay.steps["T-PAID"] = []saga.StepView{{TripID: "T-PAID", Step: "payment", Status: "done", CreatedAt: now}}
	hotel := &fakeService{steps: map[string][]saga.StepView{
		"T-HOLDING": {{TripID: "T-HOLDING", Step: "hotel", Status: "unknown", Attempts: 2, LastError: "timeout", CreatedAt: now}},
	}, effects: map[string]saga.OperatorEntry{}}
	payHS := httptest.NewServer(pay.openStepsHandler(pay.handler()))
	t.Cleanup(payHS.Close)
	hotelHS := httptest.NewServer(hotel.openStepsHandler(hotel.handler()))
	t.Cleanup(hotelHS.Close)
	b := setup(t, func(c *Config) {
		c.Services = map[string]string{"payment": payHS.URL, "hotel": hotelHS.URL}
		c.StuckAfter = time.Hour
	})
	for i, trip := range stuck {
		b.addTrip(t, trip, "canceling", time.Duration(50-i)*time.Minute) // T-REFUND-0 oldest
	}
	b.addTrip(t, "T-PAID", "confirmed", 2*time.Hour)
	b.addTrip(t, "T-HOLDING", "pending", 5*time.Minute)

	ctx := context.Background()
	res, err := b.r.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 7, res.OpenSteps, "six refunds and one hold wait on a step")
	require.Empty(t, res.StepsUnread)

	// The list by open step.
	f := TripFilter{Step: "payment", State: "compensating"}
	page, err := b.r.ListTrips(ctx, f, Oldest, "", 4, true)
	require.NoError(t, err)
	require.Equal(t, int64(6), *page.Count)
	require.Len(t, page.Items, 4)
	require.Equal(t, "T-REFUND-0", page.Items[0].TripID, "oldest first")
	require.Equal(t, &OpenStep{Company: "payment", Step: "payment", State: "compensating", Attempts: 3,
		LastError: "refund: 503 Service Unavailable", Since: page.Items[0].OpenStep.Since}, page.Items[0].OpenStep)
	require.NotEmpty(t, page.Next)
	rest, err := b.r.ListTrips(ctx, f, Oldest, page.Next, 4, false)
	require.NoError(t, err)
	require.Equal(t, []string{"T-REFUND-4", "T-REFUND-5"}, tripIDs(rest.Items))
	require.Empty(t, rest.Next, "the last page")
	for _, c := range []struct {
		f    TripFilter
		want []string
	}{
		{TripFilter{MinAttempts: 7}, []string{"T-REFUND-4", "T-REFUND-5"}},
		{TripFilter{Error: "SERVICE UNAVAILABLE"}, stuck},
		{TripFilter{Error: "timeout"}, []string{"T-HOLDING"}},
		{TripFilter{Company: "hotel"}, []string{"T-HOLDING"}},
		{TripFilter{Paused: "true"}, []string{"T-REFUND-5"}},
		{TripFilter{Paused: "false", Company: "payment", MinAttempts: 7}, []string{"T-REFUND-4"}},
		{TripFilter{Status: "confirmed"}, []string{"T-PAID"}},
		{TripFilter{MinAge: 90 * time.Minute}, []string{"T-PAID"}},
		{TripFilter{Finding: FindingStuck}, []string{"T-PAID"}}, // not settled for 2 h
		{TripFilter{Version: "default"}, nil},
		{TripFilter{From: now.Add(-91 * time.Minute / 2), To: now.Add(-89 * time.Minute / 2)}, []string{"T-REFUND-5"}},
	} {
		got, err := b.r.ListTrips(ctx, c.f, Oldest, "", 100, false)
		require.NoError(t, err)
		require.Equal(t, c.want, tripIDs(got.Items), "filter %s", c.f)
	}
	newest, err := b.r.ListTrips(ctx, TripFilter{}, Newest, "", 2, false)
	require.NoError(t, err)
	require.Equal(t, []string{"T-HOLDING", "T-REFUND-5"}, tripIDs(newest.Items))

	// Over HTTP: the same, and a bad parameter names itself.
	mux := http.NewServeMux()
	b.r.Register(mux)
	op, err := NewOperator(OperatorConfig{Reconciler: b.r, Token: testToken})
	require.NoError(t, err)
	op.Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = op.Run(runCtx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	c := bulkClient{t, hs.URL}
	var got TripPage
	require.Equal(t, http.StatusOK, c.do(http.MethodGet, "/api/trips?state=compensating&company=payment&count=1&order=oldest", "", nil, &got))
	require.Equal(t, int64(6), *got.Count)
	require.Equal(t, stuck, tripIDs(got.Items))
	var problem struct {
		Detail string `json:"detail"`
	}
	require.Equal(t, http.StatusBadRequest, c.do(http.MethodGet, "/api/trips?min_attempts=many", "", nil, &problem))
	require.Contains(t, problem.Detail, "min_attempts")
	require.Equal(t, http.StatusBadRequest, c.do(http.MethodGet, "/api/trips?state=sleeping", "", nil, &problem))
	require.Contains(t, problem.Detail, "state: one of")
	resp, err := http.Get(hs.URL + "/trips?state=compensating")
	require.NoError(t, err)
	html, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(html), `<b id="match-count">6</b>`)
	require.Contains(t, string(html), `data-trip="T-REFUND-3"`)

	// A filter that is not one is refused, never read as "every trip".
	for q, field := range map[string]string{"min_attempt=5": "min_attempt", "company=%20": "company", "status=bogus": "status"} {
		require.Equal(t, http.StatusBadRequest, c.do(http.MethodGet, "/api/trips?"+q, "", nil, &problem), q)
		require.Contains(t, problem.Detail, field+": ", q)
	}
	var fieldProblem struct {
		Errors []struct {
			Field string `json:"field"`
		} `json:"errors"`
	}
	require.Equal(t, http.StatusBadRequest, c.do(http.MethodPost, "/api/bulk-actions", "", map[string]any{"action": "pause", "dry_run": true,
		"filter": map[string]any{"min_attempt": "5"}}, &fieldProblem))
	require.Equal(t, "filter.min_attempt", fieldProblem.Errors[0].Field)
	require.Equal(t, http.StatusBadRequest, c.do(http.MethodPost, "/api/bulk-actions", "", map[string]any{"action": "settle", "dry_run": true,
		"outcome": "maybe", "filter": map[string]any{}}, &fieldProblem))
	require.Equal(t, "outcome", fieldProblem.Errors[0].Field)
	require.Equal(t, http.StatusNotFound, c.do(http.MethodGet, "/api/bulk-actions/B-NOPE", "", nil, nil))
	nb, err := http.Get(hs.URL + "/bulk/B-NOPE")
	require.NoError(t, err)
	nbPage, _ := io.ReadAll(nb.Body)
	nb.Body.Close()
	require.Equal(t, http.StatusNotFound, nb.StatusCode)
	require.Contains(t, string(nbPage), `<p id="no-bulk">no bulk action &#34;B-NOPE&#34;`)

	// The dry run counts and samples; it records nothing.
	req := map[string]any{"action": "retry_undo", "filter": map[string]any{"state": "compensating", "company": "payment"},
		"rate_per_s": 2, "canary": 2, "operator": "ada", "reason": "the card processor's refunds work again"}
	dry := clone(req)
	dry["dry_run"] = true
	var d BulkDryRun
	require.Equal(t, http.StatusOK, c.do(http.MethodPost, "/api/bulk-actions", "", dry, &d))
	require.Equal(t, 6, d.Count)
	require.Equal(t, map[string]int{"payment": 6}, d.ByService)
	require.Equal(t, "T-REFUND-0", d.Sample[0].TripID)
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM bulk_actions").Scan(&n))
	require.Zero(t, n, "a dry run records nothing")

	// A count that is not the filter's now is refused.
	wrong := clone(req)
	wrong["expected_count"] = 5
	require.Equal(t, http.StatusConflict, c.do(http.MethodPost, "/api/bulk-actions", "bulk-1", wrong, &problem))
	require.Contains(t, problem.Detail, "matches 6 trips now, not the 5 confirmed")
	run := clone(req)
	run["expected_count"] = 6
	var started BulkAction
	require.Equal(t, http.StatusCreated, c.do(http.MethodPost, "/api/bulk-actions", "bulk-1", run, &started))
	require.Equal(t, BulkCanary, started.State)

	// The canary's two go first; nothing else until they are in.
	testenv.Eventually(t, func() bool {
		bk, err := op.Bulk(ctx, started.ID, 0)
		require.NoError(t, err)
		return bk.Counts[BulkTripSent] == 2
	}, "the canary's two trips sent")
	bk, err := op.Bulk(ctx, started.ID, 100)
	require.NoError(t, err)
	require.Equal(t, BulkCanary, bk.State)
	require.Equal(t, 4, bk.Counts[BulkTripWaiting], "only the canary is sent before its outcome is in")
	ended := carryOut(t, op, pay, started.ID, func(string) string { return "1 unfinished step(s) due now" })
	require.Equal(t, BulkDone, ended.State, ended.StateReason)
	require.Equal(t, map[string]int{BulkTripDone: 6}, ended.Counts)
	// The rate limit: no two actions to payment within half a second
	// (2 a second), by the database's clock.
	var sent []time.Time
	for _, it := range ended.Items {
		sent = append(sent, *it.SentAt)
	}
	slices.SortFunc(sent, func(a, b time.Time) int { return a.Compare(b) })
	for i := 2; i < len(sent); i++ {
		require.GreaterOrEqual(t, sent[i].Sub(sent[i-2]), time.Second, "at most 2 in any second: %v", sent)
	}
	// One audit row for the bulk action, one recorded action per trip,
	// and the same request again acts once.
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM operator_actions WHERE idempotency_key LIKE 'bulk-1/%' AND reason LIKE 'bulk action '||$1||':%'", started.ID).Scan(&n))
	require.Equal(t, 6, n)
	var again BulkAction
	require.Equal(t, http.StatusOK, c.do(http.MethodPost, "/api/bulk-actions", "bulk-1", run, &again))
	require.Equal(t, started.ID, again.ID)
	require.Equal(t, http.StatusConflict, c.do(http.MethodPost, "/api/bulk-actions", "bulk-1", wrong, &problem), "the key with another request")
	resp, err = http.Get(hs.URL + "/bulk/" + started.ID)
	require.NoError(t, err)
	html, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(html), `data-ended="true"`)
	require.Contains(t, string(html), `<td data-state="done">6</td>`)

	// A failed canary stops it: the others are never sent.
	canary := map[string]any{"action": "retry_undo", "filter": map[string]any{"state": "compensating"}, "canary": 1,
		"expected_count": 6, "operator": "ada", "reason": "try one first"}
	var stopped BulkAction
	require.Equal(t, http.StatusCreated, c.do(http.MethodPost, "/api/bulk-actions", "bulk-2", canary, &stopped))
	ended = carryOut(t, op, pay, stopped.ID, func(string) string { return "refused: the refund is final" })
	require.Equal(t, BulkStopped, ended.State)
	require.Contains(t, ended.StateReason, "the canary failed")
	require.Equal(t, map[string]int{BulkTripFailed: 1, BulkTripSkipped: 5}, ended.Counts)

	// Canceled: what was not sent is skipped.
	slow := map[string]any{"action": "pause", "filter": map[string]any{"company": "payment"}, "rate_per_s": 0.2,
		"expected_count": 6, "operator": "ada", "reason": "hold them"}
	var canceled BulkAction
	require.Equal(t, http.StatusCreated, c.do(http.MethodPost, "/api/bulk-actions", "bulk-3", slow, &canceled))
	testenv.Eventually(t, func() bool {
		bk, err := op.Bulk(ctx, canceled.ID, 0)
		require.NoError(t, err)
		return bk.Counts[BulkTripSent] == 1
	}, "the first trip sent")
	require.Equal(t, http.StatusOK, c.do(http.MethodPost, "/api/bulk-actions/"+canceled.ID+"/cancel", "", map[string]any{"operator": "ada", "reason": "wrong filter"}, &canceled))
	require.Equal(t, BulkCanceled, canceled.State)
	require.Equal(t, 5, canceled.Counts[BulkTripSkipped])
	require.Equal(t, http.StatusConflict, c.do(http.MethodPost, "/api/bulk-actions/"+canceled.ID+"/cancel", "", map[string]any{"operator": "ada", "reason": "again"}, &problem))
	require.True(t, strings.Contains(problem.Detail, "ended already"))

	// A bulk re-drive names its step; each trip is re-driven from it
	// (here no stream holds their events: each is refused, and says why).
	redrive := map[string]any{"action": "redrive", "filter": map[string]any{"company": "hotel"}, "expected_count": 1,
		"operator": "ada", "reason": "the hotel's consumer skipped events"}
	require.Equal(t, http.StatusBadRequest, c.do(http.MethodPost, "/api/bulk-actions", "bulk-4", redrive, &problem))
	require.Contains(t, problem.Detail, `"step"`)
	redrive["step"] = "hotel"
	var redriven BulkAction
	require.Equal(t, http.StatusCreated, c.do(http.MethodPost, "/api/bulk-actions", "bulk-4", redrive, &redriven))
	ended = carryOut(t, op, pay, redriven.ID, func(string) string { return "" })
	require.Equal(t, map[string]int{BulkTripFailed: 1}, ended.Counts)
	require.Equal(t, "hotel", ended.Step)
	require.Contains(t, ended.Items[0].Effect, "refused: ")
}

func tripIDs(items []TripListItem) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.TripID)
	}
	return out
}

func clone(m map[string]any) map[string]any { return maps.Clone(m) }
