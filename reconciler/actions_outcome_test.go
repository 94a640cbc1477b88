package reconciler

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
)

// fakeService answers the operator endpoints of a step service
// (process.HandleOps) from what the test sets: its step rows and
// incidents by trip, and the effects of the actions it carried out.
type fakeService struct {
	mu        sync.Mutex
	steps     map[string][]saga.StepView
	incidents []saga.Incident
	effects   map[string]saga.OperatorEntry // by trip
	paused    map[string]bool               // by trip, for GET /steps?open=1
}

func (f *fakeService) handler() http.Handler {
	mux := http.NewServeMux()
	write := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /steps/{trip}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		write(w, map[string]any{"items": append([]saga.StepView{}, f.steps[r.PathValue("trip")]...)})
	})
	mux.HandleFunc("GET /incidents", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		write(w, map[string]any{"items": f.incidents})
	})
	mux.HandleFunc("GET /operator/{trip}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		items := []saga.OperatorEntry{}
		if e, ok := f.effects[r.PathValue("trip")]; ok {
			items = append(items, e)
		}
		write(w, map[string]any{"items": items})
	})
	return mux
}

func (f *fakeService) report(trip, eventID, effect string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.effects[trip] = saga.OperatorEntry{EventID: eventID, TripID: trip, Effect: effect, At: time.Now().UTC()}
}

func getOutcome(t *testing.T, base, id string) (int, ActionOutcome) {
	t.Helper()
	resp, err := http.Get(base + "/api/actions/" + id + "/outcome")
	require.NoError(t, err)
	defer resp.Body.Close()
	var out ActionOutcome
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	}
	return resp.StatusCode, out
}

// An action names what it acts on before it is recorded: a trip nobody
// knows of is refused (404), a resolve of an incident that is not open
// (409, naming those that are); a request whose key is recorded gets its
// event back even once what it acted on is gone; and what the service
// reports it did is read back, done or not.
func TestActionsNameWhatTheyActOn(t *testing.T) {
	t.Parallel()
	pay := &fakeService{
		steps: map[string][]saga.StepView{
			"T-KNOWN":   {{TripID: "T-KNOWN", Step: "payment", Status: "compensating"}},
			"T-SETTLED": {{TripID: "T-SETTLED", Step: "payment", Status: "undone"}},
		},
		incidents: []saga.Incident{{TripID: "T-KNOWN", Step: "payment", Kind: "compensation_stuck", RaisedAt: time.Now()}},
		effects:   map[string]saga.OperatorEntry{},
	}
	hs := httptest.NewServer(pay.handler())
	t.Cleanup(hs.Close)
	b := setup(t, func(c *Config) { c.Services = map[string]string{"payment": hs.URL} })
	_, base := b.operatorServer(t, testToken)
	act := func(key string, body map[string]any) answer {
		body["reason"], body["operator"] = "the card processor is back", "ada"
		return postAction(t, base, testToken, key, body)
	}

	a := act("k-nope", map[string]any{"action": "retry_undo", "trip": "T-NOPE", "service": "payment"})
	require.Equal(t, http.StatusNotFound, a.code)
	require.Contains(t, a.problem.Detail, "trip T-NOPE is not known")
	require.Contains(t, a.problem.Detail, "payment has no step of it")
	require.Equal(t, "No such trip", a.problem.Title)

	// A retry where nothing is unfinished (the incident is at another
	// service, say) would change nothing: refused, naming the steps there.
	a = act("k-settled", map[string]any{"action": "retry_undo", "trip": "T-SETTLED", "service": "payment"})
	require.Equal(t, http.StatusConflict, a.code, a.problem.Detail)
	require.Contains(t, a.problem.Detail, "payment has no unfinished step of trip T-SETTLED (its steps: payment undone)")
	retry := act("k-retry", map[string]any{"action": "retry_undo", "trip": "T-KNOWN", "service": "payment"})
	require.Equal(t, http.StatusAccepted, retry.code, retry.problem.Detail)

	a = act("k-bogus", map[string]any{"action": "resolve", "trip": "T-KNOWN", "service": "payment", "incident": "bogus_kind"})
	require.Equal(t, http.StatusConflict, a.code)
	require.Contains(t, a.problem.Detail, "no open incident bogus_kind")
	require.Contains(t, a.problem.Detail, "open there: compensation_stuck")

	a = act("k-hotel", map[string]any{"action": "resolve", "trip": "T-KNOWN", "service": "payment", "incident": "compensation_stuck"})
	require.Equal(t, http.StatusAccepted, a.code)
	id := a.event.ID()
	require.Empty(t, b.operatorMsgs(t, "T-NOPE"), "nothing recorded for the refused actions")

	code, out := getOutcome(t, base, id)
	require.Equal(t, http.StatusOK, code)
	require.False(t, out.Reported, "not carried out yet")
	pay.report("T-KNOWN", id, "1 open incident(s) resolved")
	_, out = getOutcome(t, base, id)
	require.True(t, out.Reported)
	require.True(t, out.Done)
	require.Equal(t, "1 open incident(s) resolved", out.Effect)

	// The incident is resolved now: the same request again is the same
	// action, not a refusal.
	pay.mu.Lock()
	now := time.Now()
	pay.incidents[0].ResolvedAt = &now
	pay.mu.Unlock()
	again := act("k-hotel", map[string]any{"action": "resolve", "trip": "T-KNOWN", "service": "payment", "incident": "compensation_stuck"})
	require.Equal(t, http.StatusAccepted, again.code)
	require.Equal(t, id, again.event.ID())
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))

	pause := act("k-pause", map[string]any{"action": "pause", "trip": "T-KNOWN", "service": "payment"})
	require.Equal(t, http.StatusAccepted, pause.code)
	pay.report("T-KNOWN", pause.event.ID(), "refused: nothing to pause")
	_, out = getOutcome(t, base, pause.event.ID())
	require.True(t, out.Reported)
	require.False(t, out.Done, "a refusal is no success")

	// A retry that made no step due and lifted no pause did nothing; one
	// that lifted a pause did something.
	pay.report("T-KNOWN", retry.event.ID(), "0 unfinished step(s) due now")
	_, out = getOutcome(t, base, retry.event.ID())
	require.True(t, out.Reported)
	require.False(t, out.Done, "a retry that changed nothing is no success")
	pay.report("T-KNOWN", retry.event.ID(), "0 unfinished step(s) due now; pause lifted")
	_, out = getOutcome(t, base, retry.event.ID())
	require.True(t, out.Done)

	code, _ = getOutcome(t, base, "no-such-event")
	require.Equal(t, http.StatusNotFound, code)
}

// Issue 19 item 4: an operator dismisses a finding with why: it no longer
// counts as open while it holds (the sweep does not raise it again), the
// audit trail has the action, and it is resolved once what it names is
// gone.
func TestDismissAFinding(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, base := b.operatorServer(t, testToken)
	ctx := context.Background()
	trip := "T-dismiss-1"
	b.hold(t, trip) // a hold for a trip nobody requested: an orphan
	require.Equal(t, 1, b.sweep(t).Open[FindingOrphan])
	dismiss := func(key, kind string) answer {
		return postAction(t, base, testToken, key, map[string]any{"action": "dismiss", "trip": trip, "incident": kind,
			"reason": "a test hold the hotel keeps on purpose", "operator": "ada"})
	}

	a := postAction(t, base, testToken, "k-d0", map[string]any{"action": "dismiss", "trip": trip, "reason": "r", "operator": "ada"})
	require.Equal(t, http.StatusBadRequest, a.code)
	require.Equal(t, "incident", a.problem.Errors[0].Field)
	a = dismiss("k-d1", FindingHalf)
	require.Equal(t, http.StatusConflict, a.code)
	require.Contains(t, a.problem.Detail, "has no open half finding (open: orphan)")

	a = dismiss("k-d2", FindingOrphan)
	require.Equal(t, http.StatusAccepted, a.code)
	code, out := getOutcome(t, base, a.event.ID())
	require.Equal(t, http.StatusOK, code)
	require.True(t, out.Reported && out.Done, "the reconciler carried it out when it recorded it")

	res := b.sweep(t)
	require.Zero(t, res.Open[FindingOrphan], "dismissed: not counted as open")
	require.Equal(t, 1, res.Dismissed)
	open, err := b.r.Findings(ctx, false)
	require.NoError(t, err)
	require.Empty(t, open)
	rows, err := queries.FindingListByTrip(ctx, b.pool, trip)
	require.NoError(t, err)
	require.Len(t, rows, 1, "the sweep raised no second finding")
	f := findingFromRow(rows[0])
	require.Nil(t, f.ResolvedAt)
	require.Equal(t, "ada", f.DismissedBy)
	require.Equal(t, "a test hold the hotel keeps on purpose", f.DismissReason)

	again := dismiss("k-d2", FindingOrphan)
	require.Equal(t, http.StatusAccepted, again.code, "the same key is the same action")
	require.Equal(t, a.event.ID(), again.event.ID())
	a = dismiss("k-d3", FindingOrphan)
	require.Equal(t, http.StatusConflict, a.code)
	require.Contains(t, a.problem.Detail, "dismissed already, by ada")

	// The hold released at the hotel: the finding is resolved for good.
	_, err = provider.Hotel(b.companies+"/hotel").Undo(ctx, trip+":hotel")
	require.NoError(t, err)
	res = b.sweep(t)
	require.Equal(t, 1, res.Resolved)
	require.Zero(t, res.Dismissed)
}
