package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/reconciler"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/sim"
)

// refundFailsFor is how long the card processor fails one trip's refund
// in TestOneClock.
const refundFailsFor = 10 * time.Second

// TestOneClock runs the whole system (real child processes, the
// simulators, a private PostgreSQL) with PostgreSQL's clock 10 s ahead of
// the services' and then 10 s behind (libfaketime on the postmaster,
// stack.Config.PostgresClockOffset), and books at once: good trips (some
// with a car booking answered 1 s late), a trip whose car is sold out and
// whose refund fails for 10 s, and (behind) a trip whose refund answers
// 6 s late while an operator sends two retry_undo at once. It asserts, by
// the companies' own records: every good trip confirmed and whole (none
// undone at its deadline for answers taken for stale), every other trip
// canceled and empty, one mail each; the failing refund called no more
// often than the undo backoff allows within 10 s (and at least 3 times:
// the backoff was not stretched by the offset); never two calls of one
// Idempotency-Key in flight at any company (GET <company>/_stats); and
// the operator's retries found the refund in flight and left it alone.
func TestOneClock(t *testing.T) {
	testenv.Faketime(t)
	for _, tc := range []struct {
		name    string
		offset  time.Duration
		retries bool
		env     []string
	}{
		{name: "database 10s ahead", offset: 10 * time.Second},
		// Long calls (8 s), so that the slow refund (6 s) is in flight
		// while the two retries arrive, however loaded the machine.
		{name: "database 10s behind", offset: -10 * time.Second, retries: true, env: []string{
			"CALL_TIMEOUT_MS=8000", "STEP_DEADLINE_MS=20000", reconciler.OperatorTokenEnv + "=tok-clock",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { oneClock(t, tc.offset, tc.retries, tc.env) })
	}
}

func oneClock(t *testing.T, offset time.Duration, retries bool, env []string) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "tripsaga-e2e-clock-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o711))
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	s, err := stack.Start(sctx, stack.Config{Dir: filepath.Join(dir, "stack"), Binary: bin, PostgresClockOffset: offset, Env: env})
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"payment", "car", "hotel", "trips"} {
				b, _ := os.ReadFile(s.LogPath(name))
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("==== %s log (tail)\n%s", name, b)
			}
		}
	})

	// The database's clock really is off by the offset.
	conn, err := pgx.Connect(ctx, s.DatabaseURL)
	require.NoError(t, err)
	var dbNow time.Time
	before := time.Now()
	require.NoError(t, conn.QueryRow(ctx, "SELECT now()").Scan(&dbNow))
	after := time.Now()
	conn.Close(ctx)
	require.Truef(t, dbNow.After(before.Add(offset-2*time.Second)) && dbNow.Before(after.Add(offset+2*time.Second)),
		"PostgreSQL's now() is %s, the machine's %s: not %s off", dbNow, before, offset)

	urls := s.CompanyURLs()
	e := envOf(s, demo.InsuranceOn(events.Selected()))
	nonce := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	request := func(tag string) events.TripRequest {
		in := time.Now().AddDate(0, 0, 30)
		return events.TripRequest{
			Traveler: events.Person{Name: "Ada Example", Email: tag + "+" + nonce + "@example.com"},
			Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: in.Format(time.DateOnly), Nights: 2},
			Car:      events.CarRequest{CarClass: "compact", Pickup: in.Format(time.DateOnly), Return: in.AddDate(0, 0, 2).Format(time.DateOnly)},
			Payment:  events.PaymentRequest{CardToken: "tok_" + strings.ReplaceAll(tag, "-", "") + "_" + nonce, AmountCents: 33000, Currency: "USD"},
		}
	}
	type booking struct {
		req    events.TripRequest
		status string // wanted
	}
	var trips []booking
	for i := range 4 {
		b := booking{req: request(fmt.Sprintf("good-%d", i)), status: "confirmed"}
		if i%2 == 0 {
			// The car's answer comes 1 s late: a lease judged by another
			// clock than the one that wrote it would let a second call
			// of the key start meanwhile.
			require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultSlowAnswer, DelayMS: 1000,
				Match: map[string]string{"driver.email": b.req.Traveler.Email}}))
		}
		trips = append(trips, b)
	}
	failing := booking{req: request("refund-fails"), status: "canceled"}
	trips = append(trips, failing)
	require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut,
		Match: map[string]string{"driver.email": failing.req.Traveler.Email}}))
	fails, err := sim.AddFaultRule(ctx, urls["PAYMENTS_URL"], sim.Rule{Op: sim.OpRefund, Fault: sim.FaultFail, ForMS: int(refundFailsFor.Milliseconds()),
		Match: map[string]string{"card_token": failing.req.Payment.CardToken}})
	require.NoError(t, err)
	slow := booking{req: request("refund-slow"), status: "canceled"}
	var slowRule sim.Rule
	if retries {
		trips = append(trips, slow)
		require.NoError(t, sim.AddFault(ctx, urls["CARS_URL"], sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut,
			Match: map[string]string{"driver.email": slow.req.Traveler.Email}}))
		slowRule, err = sim.AddFaultRule(ctx, urls["PAYMENTS_URL"], sim.Rule{Op: sim.OpRefund, Fault: sim.FaultSlowAnswer, DelayMS: 6000,
			Match: map[string]string{"card_token": slow.req.Payment.CardToken}})
		require.NoError(t, err)
	}

	ids := make([]string, len(trips))
	var wg sync.WaitGroup
	for i, b := range trips {
		wg.Go(func() {
			body, _ := json.Marshal(b.req)
			req, _ := http.NewRequest(http.MethodPost, s.URL("trips")+"/trips", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Prefer", "wait=0")
			req.Header.Set("Idempotency-Key", "clock-"+nonce+"-"+fmt.Sprint(i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			var a struct {
				TripID string `json:"trip_id"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&a)
			ids[i] = a.TripID
		})
	}
	wg.Wait()
	for i, id := range ids {
		require.NotEmptyf(t, id, "trip %d was taken", i)
	}

	if retries {
		slowID := ids[len(ids)-1]
		testenv.Eventually(t, func() bool {
			rules, err := sim.ListFaults(ctx, urls["PAYMENTS_URL"])
			if err != nil {
				return false
			}
			for _, r := range rules {
				if r.ID == slowRule.ID {
					return r.Applied >= 1
				}
			}
			return false
		}, "the slow refund is in flight")
		// Two operators press "retry now" at once.
		codes := make([]int, 2)
		for i := range 2 {
			wg.Go(func() {
				body, _ := json.Marshal(reconciler.ActionRequest{Action: events.ActionRetryUndo, Trip: slowID, Service: "payment",
					Reason: "the card processor says it is fixed", Operator: fmt.Sprintf("op-%d", i)})
				req, _ := http.NewRequest(http.MethodPost, s.URL("reconciler")+"/api/actions", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer tok-clock")
				req.Header.Set("Idempotency-Key", fmt.Sprintf("retry-%s-%d", nonce, i))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				resp.Body.Close()
				codes[i] = resp.StatusCode
			})
		}
		wg.Wait()
		require.Equal(t, []int{http.StatusAccepted, http.StatusAccepted}, codes, "both retries are taken")
		var oplog struct {
			Items []struct{ Action, Operator, Effect string }
		}
		testenv.Eventually(t, func() bool {
			getJSON(t, s.URL("payment")+"/operator/"+slowID, &oplog)
			return len(oplog.Items) == 2
		}, "payment carried both retries out")
		// Checked last, with the overlaps.
		defer func() {
			inFlight := 0
			for _, it := range oplog.Items {
				assert.Equal(t, "retry_undo", it.Action)
				if strings.Contains(it.Effect, "as soon as its call in flight ends") {
					inFlight++
				}
			}
			assert.Positivef(t, inFlight, "a retry found the refund in flight and left its lease alone: %+v", oplog.Items)
		}()
	}

	for i, b := range trips {
		var got struct{ Status string }
		testenv.Eventually(t, func() bool {
			getJSON(t, s.URL("trips")+"/trips/"+ids[i], &got)
			return got.Status == "confirmed" || got.Status == "canceled"
		}, "trip %s (%s) settles", ids[i], b.req.Traveler.Email)
		require.Equalf(t, b.status, got.Status, "trip %s (%s)", ids[i], b.req.Traveler.Email)
		var o demo.TripOutcome
		testenv.Eventually(t, func() bool {
			o = demo.TripOutcome{TripID: ids[i], Status: got.Status}
			e.Records(ctx, &o, b.req.Payment.CardToken)
			return o.Mails >= 1
		}, "trip %s is mailed", ids[i])
		want := demo.Whole
		if b.status == "canceled" {
			want = demo.Empty
		}
		require.Equalf(t, want, o.Verdict, "trip %s by the companies' records: %+v", ids[i], o)
		require.Equalf(t, 1, o.Mails, "trip %s: one mail", ids[i])
	}

	// The failing refund was called as often as the undo backoff says:
	// call k+1 comes at least backoff(k) after call k's answer, by the
	// database's clock, which runs at the machine's rate.
	allowed := callsWithin(refundFailsFor, saga.UndoBackoffMinDefault, saga.UndoBackoffMaxDefault)
	rules, err := sim.ListFaults(ctx, urls["PAYMENTS_URL"])
	require.NoError(t, err)
	for _, r := range rules {
		if r.ID == fails.ID {
			assert.LessOrEqualf(t, r.Applied, allowed, "refund calls during its %s of failures; the backoff allows %d", refundFailsFor, allowed)
			assert.GreaterOrEqualf(t, r.Applied, 3, "refund calls during its %s of failures: the backoff (%s doubling) was stretched", refundFailsFor, saga.UndoBackoffMinDefault)
			t.Logf("the refund failing for %s was called %d times (the backoff allows %d)", refundFailsFor, r.Applied, allowed)
		}
	}

	for _, c := range []string{"HOTEL_URL", "PAYMENTS_URL", "CARS_URL", "MAIL_URL"} {
		st, err := sim.GetStats(ctx, urls[c])
		require.NoError(t, err)
		assert.Zerof(t, st.OverlappingCalls, "%s: calls made while another of the same Idempotency-Key was in flight", c)
		assert.LessOrEqualf(t, st.MaxInFlightPerKey, int64(1), "%s: most calls of one key in flight at once", c)
	}
}

// callsWithin is how many calls a step whose undo fails every time makes
// within d, the first at 0 and each next one after the undo backoff (min
// doubling to max, as saga's backoff), counting only the waits.
func callsWithin(d, min, max time.Duration) int {
	n, at, wait := 0, time.Duration(0), min
	for at < d {
		n++
		at += wait
		wait = wait * 2
		if wait > max {
			wait = max
		}
	}
	return n
}
