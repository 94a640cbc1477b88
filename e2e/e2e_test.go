// Package e2e runs the whole system as a user runs it: the tripsaga binary
// started as one child process per service by the stack supervisor, an
// embedded NATS server, a private PostgreSQL cluster and the company
// simulators, all over real HTTP; processes are killed with SIGKILL.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/reconciler"
)

var sys *stack.Stack

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "tripsaga-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Our own folder: searchable, so the postgres OS user (run as root)
	// reaches the private cluster in dir/stack/pg.
	if err := os.Chmod(dir, 0o711); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	bin = filepath.Join(dir, "tripsaga")
	build := exec.Command("go", "build", "-o", bin, "../cmd/tripsaga")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: build:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sys, err = stack.Start(ctx, stack.Config{Dir: filepath.Join(dir, "stack"), Binary: bin, Env: []string{reconciler.OperatorTokenEnv + "=" + e2eToken}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stack:", err)
		return 1
	}
	code := m.Run()
	if code != 0 {
		for _, name := range stack.Processes {
			b, _ := os.ReadFile(sys.LogPath(name))
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			fmt.Fprintf(os.Stderr, "==== %s log (tail)\n%s\n", name, b)
		}
	}
	sys.Stop()
	return code
}

// e2eToken is the operators' token of the e2e tests' stacks that run the
// demo's situations (one of them ends with an operator's settle).
const e2eToken = "tok-e2e-situations"

// ownStack starts a whole system of its own for one test, in a new temp
// folder (kept, and named in the log, when the test fails), with env
// added to every child's environment, and stops it when the test ends.
func ownStack(t *testing.T, prefix string, env ...string) *stack.Stack {
	t.Helper()
	dir, err := os.MkdirTemp("", "tripsaga-e2e-"+prefix+"-")
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the stack's folder and logs are kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	// Searchable, so the postgres OS user (run as root) reaches its cluster.
	require.NoError(t, os.Chmod(dir, 0o711))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := stack.Start(ctx, stack.Config{Dir: filepath.Join(dir, "stack"), Binary: bin, Env: env})
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	return s
}

func env() *demo.Env { return envOf(sys, demo.InsuranceOn(events.Selected())) }

// envOf points the demo at the stack s; insured: s runs the insurance step
// (its policies are judged too).
func envOf(s *stack.Stack, insured bool) *demo.Env {
	urls := s.CompanyURLs()
	e := &demo.Env{
		TripsURL: s.URL("trips"), PaymentURL: s.URL("payment"), CarURL: s.URL("car"),
		ReconcilerURL: s.URL("reconciler"), OperatorToken: e2eToken,
		HotelURL: urls["HOTEL_URL"], PaymentsURL: urls["PAYMENTS_URL"], CarsURL: urls["CARS_URL"], MailURL: urls["MAIL_URL"],
		Kill: func(ctx context.Context, name string) error {
			if _, err := s.Kill(name); err != nil {
				return err
			}
			return s.WaitReady(ctx, name)
		},
	}
	if insured {
		e.InsurerURL = urls["INSURER_URL"]
	}
	return e
}

// TestSituations runs the demo's situations at once (so the SIGKILL
// of the payment service lands in the middle of the others) and checks each
// ends as it must, against the companies' own records. With STEPS naming
// insurance in the environment, the whole suite runs with four steps.
func TestSituations(t *testing.T) {
	checkSituations(t, demo.SituationsOf(events.Selected()), env)
}

// checkSituations runs sits at once, each against an env of newEnv, and
// checks each ends as it must, against the companies' own records.
func checkSituations(t *testing.T, sits []demo.Situation, newEnv func() *demo.Env) {
	for _, s := range sits {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv()
			o := s.Run(context.Background(), e)
			b, _ := json.MarshalIndent(o, "", "  ")
			require.Truef(t, o.OK, "outcome:\n%s", b)
			require.NotEqual(t, demo.Half, o.Verdict)
			for _, tr := range o.Trips {
				require.Equal(t, s.WantStatus, tr.Status)
				require.Equal(t, 1, tr.Mails, "the traveler is emailed once when the trip settles")
				if e.InsurerURL != "" && s.WantVerdict == demo.Whole {
					require.Equal(t, "active", tr.Policy, "the policy is in force")
				}
				switch s.Name {
				case "the insurer rejecting":
					require.Equal(t, "released", tr.Hold)
					require.Equal(t, "none", tr.Charge, "nothing charged")
					require.Equal(t, []int{0, 0}, []int{tr.Charges, tr.Refunds}, "no statement line")
					require.Equal(t, "none", tr.Booking)
					require.Equal(t, "none", tr.Policy, "no policy")
					require.Contains(t, tr.Reason, "insurance rejected")
				case "car sold out":
					require.Equal(t, "released", tr.Hold)
					require.Equal(t, "refunded", tr.Charge)
					require.Equal(t, []int{1, 1}, []int{tr.Charges, tr.Refunds}, "a charge line and a refund line")
					require.Equal(t, "none", tr.Booking)
					require.Equal(t, "car sold out", tr.Reason)
				case "card declined":
					require.Equal(t, "released", tr.Hold)
					require.Equal(t, "declined", tr.Charge)
					require.Equal(t, "none", tr.Booking, "no car")
				case "payment killed (SIGKILL) after the charge", "same POST twice, one Idempotency-Key":
					require.Equal(t, 1, tr.Charges, "charged once")
				case "car booked, answer lost":
					require.Equal(t, "booked", tr.Booking, "learned by key")
				case "car times out, never books":
					require.Contains(t, []string{"none", "canceled"}, tr.Booking)
					require.Equal(t, "released", tr.Hold)
				case "refunds fail for 30 s while undoing":
					require.Equal(t, "canceling", tr.AnswerStatus, "canceling while refunds fail")
					require.Equal(t, 202, tr.Answer)
					require.Equal(t, []int{1, 1}, []int{tr.Charges, tr.Refunds})
					require.Contains(t, strings.Join(o.Notes, "\n"), "incident compensation_stuck raised")
				}
			}
			if s.Name == "five trips, nothing wrong" {
				require.Len(t, o.Trips, 5)
			}
			if s.Name == "same POST twice, one Idempotency-Key" {
				require.Len(t, o.Trips, 1, "one trip")
			}
		})
	}
}

func post(t *testing.T, body string, hdr map[string]string) (int, map[string]any, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, sys.URL("trips")+"/trips", strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out, resp.Header
}

// validTrip is the README's example trip, three weeks from today (UTC):
// the API refuses a check-in in the past.
var validTrip = fmt.Sprintf(`{"traveler":{"name":"Ada Example","email":"ada@example.com"},"hotel":{"property_id":"P-100","check_in":%q,"nights":2},"car":{"car_class":"compact","pickup":%q,"return":%q},"payment":{"card_token":"tok_visa_ok","amount_cents":33000,"currency":"USD"}}`, day(21), day(21), day(23))

// day returns the date n days from today (UTC), YYYY-MM-DD.
func day(n int) string { return time.Now().UTC().AddDate(0, 0, n).Format(time.DateOnly) }

func TestAPI(t *testing.T) {

	t.Run("BadRequestNamesEveryField", func(t *testing.T) {
		code, body, h := post(t, `{"traveler":{"name":"","email":"nope"},"hotel":{"property_id":"P","check_in":"2026-13-40","nights":0},"car":{"car_class":"c","pickup":"`+day(23)+`","return":"`+day(21)+`"},"payment":{"card_token":"t","amount_cents":-5,"currency":"usd"}}`, nil)
		require.Equal(t, http.StatusBadRequest, code)
		require.Equal(t, "application/problem+json", h.Get("Content-Type"))
		var fields []string
		for _, e := range body["errors"].([]any) {
			fields = append(fields, e.(map[string]any)["field"].(string))
		}
		require.ElementsMatch(t, []string{"traveler.name", "traveler.email", "hotel.check_in", "hotel.nights", "car.return", "payment.amount_cents", "payment.currency"}, fields)
	})

	t.Run("MalformedJSONIsA400", func(t *testing.T) {
		code, body, _ := post(t, `{"traveler":`, nil)
		require.Equal(t, http.StatusBadRequest, code)
		require.Contains(t, body["errors"].([]any)[0].(map[string]any)["detail"], "body is not JSON")
		code, body, _ = post(t, strings.Replace(validTrip, `"nights":2`, `"nights":"two"`, 1), nil)
		require.Equal(t, http.StatusBadRequest, code)
		require.Len(t, body["errors"], 1)
		require.Equal(t, map[string]any{"field": "hotel.nights", "pointer": "#/hotel/nights", "detail": "must be a JSON integer from 1 to 30"}, body["errors"].([]any)[0])
	})

	t.Run("OversizedBodyIs413", func(t *testing.T) {
		code, body, h := post(t, strings.Replace(validTrip, "Ada Example", strings.Repeat("A", 70<<10), 1), nil)
		require.Equal(t, http.StatusRequestEntityTooLarge, code)
		require.Equal(t, "application/problem+json", h.Get("Content-Type"))
		require.Contains(t, body["detail"], "at most")
	})

	t.Run("KeyReusedWithAnotherBodyIs409", func(t *testing.T) {
		key := map[string]string{"Idempotency-Key": "e2e-reuse", "Prefer": "wait=0"}
		code, first, _ := post(t, validTrip, key)
		require.Equal(t, http.StatusAccepted, code)
		code, _, _ = post(t, strings.Replace(validTrip, "33000", "34000", 1), key)
		require.Equal(t, http.StatusConflict, code)
		code, again, _ := post(t, validTrip, key)
		require.Contains(t, []int{201, 202}, code)
		require.Equal(t, first["trip_id"], again["trip_id"])
	})

	t.Run("PreferWaitZeroAnswers202WithLocation", func(t *testing.T) {
		code, body, h := post(t, validTrip, map[string]string{"Prefer": "wait=0"})
		require.Equal(t, http.StatusAccepted, code)
		require.Equal(t, "/trips/"+body["trip_id"].(string), h.Get("Location"))
		require.Equal(t, "pending", body["status"])
	})

	t.Run("GetUnknownTripIs404AndListPages", func(t *testing.T) {
		resp, err := http.Get(sys.URL("trips") + "/trips/T-nope")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
		resp, err = http.Get(sys.URL("trips") + "/trips?limit=1")
		require.NoError(t, err)
		var page struct {
			Items []map[string]any `json:"items"`
			Next  string           `json:"next"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&page))
		resp.Body.Close()
		require.Len(t, page.Items, 1)
		require.NotEmpty(t, page.Next)
		resp, err = http.Get(sys.URL("trips") + "/trips?status=bogus")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})
}

// TestKillEveryService books trips, SIGKILLs hotel, car and trips while
// they are in flight, and checks every trip still ends whole. It runs alone:
// the other tests would meet the killed trips API.
func TestKillEveryService(t *testing.T) {
	e := env()
	ctx := context.Background()
	var ids []string
	for i := range 8 {
		body := strings.Replace(validTrip, "ada@example.com", fmt.Sprintf("kill%d@example.com", i), 1)
		code, out, _ := post(t, body, map[string]string{"Prefer": "wait=0"})
		require.Equal(t, http.StatusAccepted, code)
		ids = append(ids, out["trip_id"].(string))
	}
	names := []string{"hotel", "car", "trips"}
	if e.InsurerURL != "" { // the whole suite runs with four steps (STEPS)
		names = append(names, "insurance")
	}
	for _, name := range names {
		require.NoError(t, e.Kill(ctx, name))
	}
	for _, id := range ids {
		var trip map[string]any
		deadline := time.Now().Add(90 * time.Second)
		for time.Now().Before(deadline) {
			resp, err := http.Get(sys.URL("trips") + "/trips/" + id)
			if err == nil {
				trip = nil
				_ = json.NewDecoder(resp.Body).Decode(&trip)
				resp.Body.Close()
				if trip["status"] == "confirmed" {
					break
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		require.Equal(t, "confirmed", trip["status"], "trip %s", id)
		for res, want := range map[string]string{"/holds/" + id + ":hotel": "held", "/bookings/" + id + ":car": "booked"} {
			base := e.HotelURL
			if strings.HasPrefix(res, "/bookings") {
				base = e.CarsURL
			}
			resp, err := http.Get(base + res)
			require.NoError(t, err)
			var rec map[string]any
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&rec))
			resp.Body.Close()
			require.Equal(t, want, rec["status"], res)
		}
	}

}

// TestPoisonEventIsParked publishes garbage and an event of an unknown type
// onto the HOTEL stream of the running system: both are parked in
// DEADLETTER with the reason, and trips keep flowing past them.
func TestPoisonEventIsParked(t *testing.T) {
	ctx := context.Background()
	js, dl, before := deadLetterStream(t)

	_, err := js.PublishMsg(ctx, &nats.Msg{Subject: "hotel.held.T-poison", Data: []byte("{not json"), Header: nats.Header{"ce-specversion": {"1.0"}}})
	require.NoError(t, err)
	unknown, err := events.New(events.Source("hotel"), "io.tripsaga.hotel.upgraded.v1", "T-poison2", map[string]string{})
	require.NoError(t, err)
	h, err := events.EncodeHeaders(unknown)
	require.NoError(t, err)
	m := &nats.Msg{Subject: "hotel.held.T-poison2", Data: unknown.Data(), Header: nats.Header{}}
	for k, v := range h {
		m.Header[k] = []string{v}
	}
	_, err = js.PublishMsg(ctx, m)
	require.NoError(t, err)

	// Consumers of hotel.held (payment, or insurance with four steps;
	// trips and the reconciler) each park both.
	consumers := consumersOf(events.HotelHeld)
	testenv.Eventually(t, func() bool {
		info, err := dl.Info(ctx)
		return err == nil && info.State.Msgs >= before.State.Msgs+uint64(2*len(consumers))
	}, "two parked copies a consumer")
	var reasons []string
	info, err := dl.Info(ctx)
	require.NoError(t, err)
	for seq := before.State.LastSeq + 1; seq <= info.State.LastSeq; seq++ {
		msg, err := dl.GetMsg(ctx, seq)
		require.NoError(t, err)
		reasons = append(reasons, msg.Header.Get(inbox.HeaderDeadConsumer)+": "+msg.Header.Get(inbox.HeaderDeadReason))
	}
	joined := strings.Join(reasons, "\n")
	for _, c := range consumers {
		require.Contains(t, joined, c+": cannot decode")
		require.Contains(t, joined, c+": events: unknown event type")
	}

	code, body, _ := post(t, validTrip, map[string]string{"Prefer": "wait=30"})
	require.Equal(t, http.StatusCreated, code, "trips flow past the parked events")
	require.Equal(t, "confirmed", body["status"])
}
