package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/reconciler"
	"github.com/tripsaga/tripsaga/sim"
)

// booked is one trip the load of TestChangingTheStepsUnderLoad booked:
// the versions it may have started under (the trips service's STEPS
// before and after a restart of it that overlapped its POST).
type booked struct {
	id, card string
	may      []string
}

// TestChangingTheStepsUnderLoad turns the insurance step off and on
// again with a rolling restart (one process after another, each started
// with the new STEPS) while trips are booked at a steady rate, a fifth
// of them with the car sold out and a fifth with the card declined.
// Every trip must end whole or empty judged by the companies' own records
// under its own version: a trip started without insurance has no policy
// at all, one started with it has its policy active (whole) or not in
// force (empty); one mail each; and the reconciler's view and timeline
// name the version it started under, which is the trips service's STEPS
// at its POST. The insurance service keeps running throughout (with
// STEPS off it still finishes the insured trips in flight).
func TestChangingTheStepsUnderLoad(t *testing.T) {
	// Its own stack: it runs beside the other tests that have one.
	t.Parallel()
	require.NotEmpty(t, bin, "TestMain builds the binary")
	const (
		insured = "hotel,insurance,payment,car"
		plain   = "hotel,payment,car"
	)
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o711))
	// A bound on the whole test, not a figure: on a host busy with the rest
	// of the suite (load 40 to 70 in CI) it ran past 6 min.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s, err := stack.Start(ctx, stack.Config{Dir: filepath.Join(dir, "stack"), Binary: bin, Env: []string{
		reconciler.OperatorTokenEnv + "=" + e2eToken,
		events.StepsVar + "=" + insured,
	}})
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range append(stack.Processes, "insurance") {
				b, _ := os.ReadFile(s.LogPath(name))
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("==== %s log (tail)\n%s", name, b)
			}
		}
	})
	env := envOf(s, true) // the insurer's records are read for every trip
	urls := s.CompanyURLs()

	// The trips service's STEPS over time: current is its version now,
	// switching while its restart is under way (either may answer).
	var mu sync.Mutex
	current, switching := insured, ""
	var trips []booked
	stop := make(chan struct{})
	var load sync.WaitGroup
	load.Go(func() {
		nonce := time.Now().UnixNano()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(150 * time.Millisecond):
			}
			email := fmt.Sprintf("switch%d+%d@example.com", i, nonce)
			card := fmt.Sprintf("tok_switch_%d_%d", i, nonce)
			switch i % 5 {
			case 3:
				require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut, Match: map[string]string{"driver.email": email}}))
			case 4:
				require.NoError(t, sim.AddFault(ctx, urls["PAYMENTS_URL"], sim.Rule{Op: sim.OpCharge, Fault: sim.FaultDeclined, Match: map[string]string{"card_token": card}}))
			}
			mu.Lock()
			may := []string{current}
			if switching != "" {
				may = append(may, switching)
			}
			mu.Unlock()
			id := postTrip(t, ctx, s.URL("trips"), email, card)
			mu.Lock()
			if switching != "" && !slices.Contains(may, switching) {
				may = append(may, switching)
			}
			if !slices.Contains(may, current) {
				may = append(may, current)
			}
			trips = append(trips, booked{id: id, card: card, may: may})
			mu.Unlock()
		}
	})
	rolling := func(steps string) {
		// Trips in the middle: before it, the step services run the new
		// STEPS while trips still starts old-version trips; after it,
		// the rest run the old one while new-version trips arrive.
		for _, name := range []string{"hotel", "payment", "trips", "car", "reconciler"} {
			if name == "trips" {
				mu.Lock()
				switching = steps
				mu.Unlock()
			}
			require.NoError(t, s.Restart(ctx, name, events.StepsVar+"="+steps), "restart %s", name)
			if name == "trips" {
				mu.Lock()
				current, switching = steps, ""
				mu.Unlock()
			}
		}
	}
	booking := func(n int) { // wait until n more trips are booked
		mu.Lock()
		want := len(trips) + n
		mu.Unlock()
		testenv.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(trips) >= want }, "%d trips booked", want)
	}
	booking(10)
	rolling(plain) // insurance off: the default order
	booking(10)
	rolling(insured) // and on again
	booking(10)
	close(stop)
	load.Wait()
	mu.Lock()
	defer mu.Unlock()

	byVersion := map[string]int{}
	for _, b := range trips {
		var view struct {
			Status  string `json:"status"`
			Settled string `json:"settled"`
			Version string `json:"version"`
		}
		testenv.Eventually(t, func() bool {
			code, err := jsonGet(ctx, s.URL("reconciler")+"/view/"+b.id, &view)
			return err == nil && code == http.StatusOK && view.Settled != "" && view.Version != ""
		}, "trip %s settled in the reconciler's view", b.id)
		require.Contains(t, b.may, view.Version, "trip %s started under the trips service's STEPS at its POST", b.id)
		byVersion[view.Version]++
		var tr struct {
			Status string `json:"status"`
		}
		code, err := jsonGet(ctx, s.URL("trips")+"/trips/"+b.id, &tr)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
		o := demo.TripOutcome{TripID: b.id, Status: tr.Status}
		env.Records(ctx, &o, b.card)
		if view.Version == plain {
			require.Equal(t, "none", o.Policy, "trip %s of a version without insurance has no policy", b.id)
			o.Policy = "" // judged as the three-step saga it is
		}
		require.Contains(t, []string{demo.Whole, demo.Empty}, demo.Verdict(o), "trip %s (%s): %+v", b.id, view.Version, o)
		require.Equal(t, 1, o.Mails, "trip %s: one mail", b.id)

		var tl struct {
			Version string `json:"version"`
		}
		code, err = jsonGet(ctx, s.URL("reconciler")+"/api/trips/"+b.id+"/timeline", &tl)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, view.Version, tl.Version, "the timeline names the trip's version")
	}
	t.Logf("trips by version: %v", byVersion)
	require.GreaterOrEqual(t, byVersion[plain], 5, "trips started without insurance")
	require.GreaterOrEqual(t, byVersion[insured], 10, "trips started with it, before and after")

	var findings struct {
		Items []reconciler.Finding `json:"items"`
	}
	code, err := jsonGet(ctx, s.URL("reconciler")+"/findings", &findings)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	for _, f := range findings.Items {
		require.NotEqual(t, reconciler.FindingHalf, f.Kind, "no half trip by the reconciler's rule either: %+v", f)
	}
}

// postTrip books a trip for email paid with card (Prefer: wait=0) and
// returns its id; a POST the restarting trips service does not answer is
// sent again with the same Idempotency-Key.
func postTrip(t *testing.T, ctx context.Context, tripsURL, email, card string) string {
	in := time.Now().AddDate(0, 0, 30)
	req := events.TripRequest{
		Traveler: events.Person{Name: "Ada Example", Email: email},
		Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: in.Format(time.DateOnly), Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: in.Format(time.DateOnly), Return: in.AddDate(0, 0, 2).Format(time.DateOnly)},
		Payment:  events.PaymentRequest{CardToken: card, AmountCents: 33000, Currency: "USD"},
	}
	body, _ := json.Marshal(req)
	var id string
	testenv.Eventually(t, func() bool {
		hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, tripsURL+"/trips", bytes.NewReader(body))
		hr.Header.Set("Content-Type", "application/json")
		hr.Header.Set("Prefer", "wait=0")
		hr.Header.Set("Idempotency-Key", "key-"+email)
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var a struct {
			TripID string `json:"trip_id"`
		}
		if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusAccepted || json.NewDecoder(resp.Body).Decode(&a) != nil {
			return false
		}
		id = a.TripID
		return id != ""
	}, "POST /trips for %s answered", email)
	return id
}

// jsonGet GETs u into v and returns the status code.
func jsonGet(ctx context.Context, u string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
}
