package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/sim"
)

// fakeSystem is a stack made of in-memory simulators and one fake server
// standing for every service under /<service>: GET /trips/trips (the trips
// given), GET /<service>/steps/{id} (the steps given) and GET
// /<service>/incidents (one incident of payment).
type fakeSystem struct {
	companies map[string]string
	svc       string

	mu    sync.Mutex
	trips []trip
	steps map[string][]map[string]string // "<service> <trip>" -> rows
}

func (f *fakeSystem) Instances() []string                     { return []string{"sim", "trips", "hotel"} }
func (f *fakeSystem) URLs(process string) []string            { return []string{f.svc + "/" + process} }
func (f *fakeSystem) Kill(string) (int, error)                { return 0, errors.New("no kills here") }
func (f *fakeSystem) CompanyURLs() map[string]string          { return f.companies }
func (f *fakeSystem) WaitReady(context.Context, string) error { return nil }

func newFakeSystem(t *testing.T) *fakeSystem {
	t.Helper()
	sims, err := sim.New(context.Background(), sim.Config{Memory: true})
	require.NoError(t, err)
	simSrv := httptest.NewServer(sims.Handler())
	t.Cleanup(simSrv.Close)
	t.Cleanup(sims.Close)
	f := &fakeSystem{steps: map[string][]map[string]string{}, companies: map[string]string{
		"HOTEL_URL": simSrv.URL + "/hotel", "PAYMENTS_URL": simSrv.URL + "/payments", "CARS_URL": simSrv.URL + "/cars", "MAIL_URL": simSrv.URL + "/mail",
	}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /trips/trips", func(w http.ResponseWriter, _ *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"items": f.trips})
	})
	steps := func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		svc := r.PathValue("svc")
		items := f.steps[svc+" "+r.PathValue("id")]
		if items == nil {
			items = []map[string]string{}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
	}
	mux.HandleFunc("GET /{svc}/steps/{id}", steps)
	mux.HandleFunc("GET /{svc}/incidents", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("svc") != "payment" {
			_, _ = w.Write([]byte(`{"items":[]}`))
			return
		}
		_, _ = w.Write([]byte(`{"items":[{"trip_id":"T-open","step":"payment","kind":"compensation_stuck","attempts":5}]}`))
	})
	svc := httptest.NewServer(mux)
	t.Cleanup(svc.Close)
	f.svc = svc.URL
	return f
}

// withInsurer adds the insurer to f's companies, as a stack with the
// insurance step on has it (INSURER_URL).
func (f *fakeSystem) withInsurer() *fakeSystem {
	f.companies["INSURER_URL"] = strings.TrimSuffix(f.companies["HOTEL_URL"], "/hotel") + "/insurer"
	return f
}

// do makes one company call and fails the test unless it answers want.
func (f *fakeSystem) do(t *testing.T, company, path, key string, body any, want int) {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, f.companies[company]+path, rd)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, want, resp.StatusCode, "%s %s", company, path)
}

// addTrip records a trip in the fake trips service and makes the given
// effects at the companies: "hold", "release", "charge", "charge-again"
// (a second charge of the same trip under another key), "refund", "book",
// "mail", and the insurer's (withInsurer) "insure", "insure-again" and
// "void" (the policy canceled).
func (f *fakeSystem) addTrip(t *testing.T, id, status string, effects ...string) {
	t.Helper()
	card := "tok_" + strings.ToLower(id)
	in := time.Now().UTC().AddDate(0, 0, 30).Format(time.DateOnly)
	out := time.Now().UTC().AddDate(0, 0, 32).Format(time.DateOnly)
	guest := map[string]string{"name": "Ada " + id, "email": "ada@example.com"}
	for _, e := range effects {
		switch e {
		case "hold":
			f.do(t, "HOTEL_URL", "/holds", id+":hotel", map[string]any{"trip_id": id, "property_id": "P-1", "check_in": in, "nights": 2, "guest": guest}, http.StatusCreated)
		case "release":
			f.do(t, "HOTEL_URL", "/holds/"+id+":hotel/release", "", nil, http.StatusOK)
		case "charge", "charge-again":
			key := id + ":charge"
			if e == "charge-again" {
				key += "-again"
			}
			f.do(t, "PAYMENTS_URL", "/charges", key, map[string]any{"trip_id": id, "amount_cents": 33000, "currency": "USD", "card_token": card}, http.StatusCreated)
		case "refund":
			f.do(t, "PAYMENTS_URL", "/charges/"+id+":charge/refund", "", nil, http.StatusOK)
		case "book":
			f.do(t, "CARS_URL", "/bookings", id+":car", map[string]any{"trip_id": id, "car_class": "compact", "pickup": in, "return": out, "driver": guest}, http.StatusCreated)
		case "insure", "insure-again":
			key := id + ":insurance"
			if e == "insure-again" {
				key += "-again"
			}
			f.do(t, "INSURER_URL", "/policies", key, map[string]any{"trip_id": id, "traveler": guest, "start": in, "end": out, "trip_cost_cents": 33000, "currency": "USD"}, http.StatusCreated)
		case "void":
			f.do(t, "INSURER_URL", "/policies/"+id+":insurance/cancel", "", nil, http.StatusOK)
		case "mail":
			f.do(t, "MAIL_URL", "/messages", id+":mail:"+status, map[string]any{"to": "ada@example.com", "subject": "s", "text": "t", "trip_id": id}, http.StatusAccepted)
		default:
			t.Fatalf("unknown effect %q", e)
		}
	}
	req := &events.TripRequest{Traveler: events.Person{Name: "Chaos Traveler " + id, Email: "ada@example.com"}, Payment: events.PaymentRequest{CardToken: card}}
	f.mu.Lock()
	f.trips = append(f.trips, trip{TripID: id, Status: status, Request: req})
	f.mu.Unlock()
}

// audit runs the settle-and-audit phase of a run on f (no faults, a short
// limit) and returns its report.
func audit(t *testing.T, f *fakeSystem) *Report {
	t.Helper()
	r, rep, err := newRun(f, Config{Faults: []Fault{}, SettleLimit: 3 * time.Second})
	require.NoError(t, err)
	stopped := time.Now()
	rep.FaultsStoppedAt = stopped
	r.audit(context.Background(), rep, stopped)
	return rep
}

func TestAuditWholeAndEmptyPass(t *testing.T) {
	t.Parallel()
	f := newFakeSystem(t)
	f.addTrip(t, "T-whole", "confirmed", "hold", "charge", "book", "mail")
	f.addTrip(t, "T-empty", "canceled", "hold", "charge", "refund", "release", "mail")
	f.addTrip(t, "T-declined", "canceled", "hold", "release", "mail")
	// A delay notice and a correction beside the final mails are no
	// second mail: counted apart (issue 22 item 3).
	f.do(t, "MAIL_URL", "/messages", "T-empty:mail:delayed", map[string]any{"to": "ada@example.com", "subject": "s", "text": "t", "trip_id": "T-empty"}, http.StatusAccepted)
	f.do(t, "MAIL_URL", "/messages", "T-whole:mail:correction", map[string]any{"to": "ada@example.com", "subject": "s", "text": "t", "trip_id": "T-whole"}, http.StatusAccepted)
	rep := audit(t, f)
	require.NoError(t, rep.Err())
	require.True(t, rep.Settled)
	require.Equal(t, 3, rep.Trips)
	require.Equal(t, 1, rep.Whole)
	require.Equal(t, 2, rep.Empty)
	require.Zero(t, rep.Half)
	require.Zero(t, rep.DuplicatesTotal)
	require.Equal(t, MailStats{ExactlyOne: 3, Notices: 1, Corrections: 1}, rep.Mails)
	require.Equal(t, 1, rep.IncidentsTotal)
	require.Equal(t, 1, rep.IncidentKinds["payment compensation_stuck"])
	var out bytes.Buffer
	rep.Print(&out)
	require.Contains(t, out.String(), "whole 1, empty 2, HALF 0")
	require.Contains(t, out.String(), "exactly one 3, none 0, more than one 0 (final mails; besides them 1 delay notice(s), 1 correction(s))")
	require.Contains(t, out.String(), "RESULT: PASS")
}

// A synthetic half trip (canceled, its hold still held), a doubled charge,
// a trip without a mail, one with two, one whose undo is still being
// retried, and a hold of a trip nobody booked are each reported, and the
// report fails.
func TestAuditReportsHalfAndDuplicates(t *testing.T) {
	t.Parallel()
	f := newFakeSystem(t)
	f.addTrip(t, "T-whole", "confirmed", "hold", "charge", "book", "mail")
	f.addTrip(t, "T-half", "canceled", "hold", "charge", "refund", "mail")
	f.addTrip(t, "T-double", "confirmed", "hold", "charge", "charge-again", "book", "mail")
	f.addTrip(t, "T-nomail", "confirmed", "hold", "charge", "book")
	f.addTrip(t, "T-open", "canceling", "hold", "charge")
	f.mu.Lock()
	f.steps["payment T-open"] = []map[string]string{{"step": "payment", "idempotency_key": "T-open:charge", "status": "compensating"}}
	f.mu.Unlock()
	// Two mails for one trip: the confirmation under two keys.
	f.addTrip(t, "T-twomails", "confirmed", "hold", "charge", "book", "mail")
	f.do(t, "MAIL_URL", "/messages", "T-twomails:mail:again", map[string]any{"to": "ada@example.com", "subject": "s", "text": "t", "trip_id": "T-twomails"}, http.StatusAccepted)

	// A hold for a trip the trips service never recorded.
	f.do(t, "HOTEL_URL", "/holds", "T-ghost:hotel", map[string]any{"trip_id": "T-ghost", "property_id": "P-1",
		"check_in": time.Now().UTC().AddDate(0, 0, 30).Format(time.DateOnly), "nights": 2, "guest": map[string]string{"name": "Ghost", "email": "ghost@example.com"}}, http.StatusCreated)

	rep := audit(t, f)
	err := rep.Err()
	require.Error(t, err)
	require.False(t, rep.Settled)
	require.Equal(t, 6, rep.Trips)
	require.Equal(t, 3, rep.Whole, "T-whole, T-nomail, T-twomails: whole, mails aside")
	require.Equal(t, 2, rep.Half, "T-half and T-double")
	require.Equal(t, 1, rep.Unsettled, "T-open")
	require.Equal(t, 1, rep.Duplicates["payments charges"])
	require.Equal(t, 1, rep.Duplicates["payments charge lines"])
	require.Equal(t, 1, rep.Duplicates["mail messages"])
	require.Equal(t, 3, rep.DuplicatesTotal)
	require.Equal(t, MailStats{ExactlyOne: 3, None: 2, More: 1}, rep.Mails)
	require.Equal(t, []string{"holds T-ghost"}, rep.Orphans)
	for _, want := range []string{"2 half trip(s)", "3 duplicate effect(s)", "1 trip(s) not settled", "3 trip(s) without exactly one mail", "1 company record(s) of trips nobody booked: holds T-ghost"} {
		require.Contains(t, err.Error(), want)
	}
	bad := map[string]TripAudit{}
	for _, a := range rep.Bad {
		bad[a.TripID] = a
	}
	require.Equal(t, "HALF", bad["T-half"].Verdict)
	require.Equal(t, "held", bad["T-half"].Hold)
	require.Equal(t, 2, bad["T-double"].Charges)
	require.Equal(t, []string{"payments charges 2", "payments charge lines 2"}, bad["T-double"].Duplicates)
	require.Equal(t, []string{"payment T-open:charge compensating"}, bad["T-open"].Unfinished)
	require.NotContains(t, bad, "T-whole")

	var out bytes.Buffer
	rep.Print(&out)
	require.Contains(t, out.String(), "whole 3, empty 0, HALF 2")
	require.Contains(t, out.String(), "RESULT: FAIL")
	require.Contains(t, out.String(), "T-double confirmed: hold held, charge charged (2 charge/0 refund lines)")
}

// Two trips made from one Idempotency-Key (one traveler of the run) are a
// duplicate too.
func TestAuditTwoTripsForOneKey(t *testing.T) {
	t.Parallel()
	rep := &Report{Settled: true, Duplicates: map[string]int{}}
	a := func(id string) TripAudit {
		return TripAudit{Traveler: "Chaos Traveler x 7", Records: map[string]int{"holds": 1, "charges": 1, "bookings": 1, "messages": 1},
			TripOutcome: demo.TripOutcome{TripID: id, Status: "confirmed", Hold: "held", Charge: "charged", Booking: "booked", Charges: 1, Mails: 1, Verdict: demo.Whole}}
	}
	summarize(rep, []TripAudit{a("T-1"), a("T-2")}, nil)
	require.Equal(t, 1, rep.Duplicates["trips per Idempotency-Key"])
	require.ErrorContains(t, rep.Err(), "duplicate")
}

// The simulators are never killed; every service replica and NATS node
// may be. The travelers' mix follows its shares, the declined ones pay
// with the card the card processor always declines, and the sold-out ones
// share the address their rule matches.
func TestVictimsAndTravelers(t *testing.T) {
	t.Parallel()
	require.False(t, killable("sim"))
	for _, in := range []string{"hotel", "hotel-2", "trips-2", "reconciler", "nats-1", "nats-3"} {
		require.True(t, killable(in), in)
	}
	r, _, err := newRun(&fakeSystem{svc: "http://127.0.0.1:1"}, Config{Seed: 7})
	require.NoError(t, err)
	counts := map[string]int{}
	keys := map[string]bool{}
	for n := 1; n <= 10000; n++ {
		b := r.newBooking(n)
		counts[b.kind]++
		require.False(t, keys[b.key], "keys are unique")
		keys[b.key] = true
		require.NoError(t, b.req.ValidateNew(time.Now()), "a valid request")
		switch b.kind {
		case KindDeclined:
			require.Equal(t, sim.DeclinedCardToken, b.req.Payment.CardToken)
		case KindCarSoldOut, KindHotelSoldOut:
			require.Equal(t, r.email(b.kind, 0), b.req.Traveler.Email)
		}
	}
	for _, m := range mix {
		require.InDelta(t, m.percent*100, counts[m.kind], 300, "%s: %d of 10000", m.kind, counts[m.kind])
	}
}

// Two writes of one Idempotency-Key in flight at once at a company (what
// two replicas calling for one step would do) are reported and fail the
// run; a whole trip made one call at a time passes that check.
func TestAuditReportsCallsInFlightTwice(t *testing.T) {
	t.Parallel()
	f := newFakeSystem(t)
	f.addTrip(t, "T-whole", "confirmed", "hold", "charge", "book", "mail")
	rep := audit(t, f)
	require.NoError(t, rep.Err())
	require.Zero(t, rep.OverlappingCallsTotal)

	// The payment company answers slowly: a second charge of the same key
	// arrives while the first is in flight.
	ctx := context.Background()
	require.NoError(t, sim.AddFault(ctx, f.companies["PAYMENTS_URL"], sim.Rule{Op: sim.OpCharge, Fault: sim.FaultSlowAnswer, DelayMS: 500, Times: 1}))
	g := make(chan struct{})
	go func() {
		defer close(g)
		f.do(t, "PAYMENTS_URL", "/charges", "T-whole:charge", map[string]any{"trip_id": "T-whole", "amount_cents": 33000, "currency": "USD", "card_token": "tok_t-whole"}, http.StatusCreated)
	}()
	require.Eventually(t, func() bool {
		rules, err := sim.ListFaults(ctx, f.companies["PAYMENTS_URL"])
		return err == nil && len(rules) == 1 && rules[0].Applied == 1
	}, 10*time.Second, 5*time.Millisecond, "the slow charge is in flight")
	f.do(t, "PAYMENTS_URL", "/charges", "T-whole:charge", map[string]any{"trip_id": "T-whole", "amount_cents": 33000, "currency": "USD", "card_token": "tok_t-whole"}, http.StatusCreated)
	<-g
	rep = audit(t, f)
	require.Error(t, rep.Err())
	require.EqualValues(t, 1, rep.OverlappingCalls["payments"])
	require.EqualValues(t, 1, rep.OverlappingCallsTotal)
	require.Contains(t, rep.Err().Error(), "1 call(s) made while another of the same Idempotency-Key was in flight")
	var out bytes.Buffer
	rep.Print(&out)
	require.Regexp(t, `calls in flight twice +1 \(cars 0, hotel 0, mail 0, payments 1\)`, out.String())
}

// With the insurance step on, the audit judges each trip's policy from the
// insurer's own records: a confirmed trip with its policy active and a
// canceled one whose policy was canceled (or never bought) pass; a policy
// active on a canceled trip, a confirmed trip without one, and two
// policies for one trip are each reported, and the run fails. The
// insurance service's steps and incidents are read too.
func TestAuditJudgesThePolicyFromTheInsurersRecords(t *testing.T) {
	t.Parallel()
	f := newFakeSystem(t).withInsurer()
	f.addTrip(t, "T-whole", "confirmed", "hold", "insure", "charge", "book", "mail")
	f.addTrip(t, "T-empty", "canceled", "hold", "insure", "charge", "refund", "void", "release", "mail")
	f.addTrip(t, "T-refused", "canceled", "hold", "release", "mail") // the insurer refused: no policy
	rep := audit(t, f)
	require.NoError(t, rep.Err())
	require.Equal(t, 1, rep.Whole)
	require.Equal(t, 2, rep.Empty)

	f.addTrip(t, "T-kept", "canceled", "hold", "insure", "charge", "refund", "release", "mail")
	f.addTrip(t, "T-nopolicy", "confirmed", "hold", "charge", "book", "mail")
	f.addTrip(t, "T-twopolicies", "confirmed", "hold", "insure", "insure-again", "charge", "book", "mail")
	f.addTrip(t, "T-open", "canceling", "hold", "insure")
	f.mu.Lock()
	f.steps["insurance T-open"] = []map[string]string{{"step": "insurance", "idempotency_key": "T-open:insurance", "status": "compensating"}}
	f.mu.Unlock()
	rep = audit(t, f)
	err := rep.Err()
	require.Error(t, err)
	require.Equal(t, 2, rep.Whole, "T-whole, and T-twopolicies by key (its doubled policy is a duplicate)")
	require.Equal(t, 2, rep.Empty)
	require.Equal(t, 2, rep.Half, "T-kept (a policy active on a canceled trip) and T-nopolicy (a confirmed trip without one)")
	require.Equal(t, 1, rep.Unsettled, "T-open: its policy's cancel is still being retried")
	require.Equal(t, 1, rep.Duplicates["insurer policies"])
	require.Contains(t, err.Error(), "2 half trip(s)")
	bad := map[string]TripAudit{}
	for _, a := range rep.Bad {
		bad[a.TripID] = a
	}
	require.Equal(t, "active", bad["T-kept"].Policy)
	require.Equal(t, "none", bad["T-nopolicy"].Policy)
	require.Equal(t, []string{"insurer policies 2"}, bad["T-twopolicies"].Duplicates)
	require.Equal(t, []string{"insurance T-open:insurance compensating"}, bad["T-open"].Unfinished)
	var out bytes.Buffer
	rep.Print(&out)
	require.Contains(t, out.String(), "T-kept canceled: hold released, charge refunded (1 charge/1 refund lines), car none, 1 mail(s), policy active")
	require.Regexp(t, `calls in flight twice +0 \(cars 0, hotel 0, insurer 0, mail 0, payments 0\)`, out.String())
}

// With the insurance step on, the insurer draws faults like every company
// (its buy the forward ones, its cancel the undo ones), and one in 14 of
// the ok travelers is refused by it, sharing the address its rule matches.
func TestInsurerFaultsAndTravelers(t *testing.T) {
	t.Parallel()
	f := (&fakeSystem{svc: "http://127.0.0.1:1", companies: map[string]string{"HOTEL_URL": "http://127.0.0.1:1/hotel"}}).withInsurer()
	r, _, err := newRun(f, Config{Seed: 7})
	require.NoError(t, err)
	ops := map[string]int{}
	for _, x := range r.cfg.Faults {
		if x.Company == "INSURER_URL" {
			ops[x.Rule.Op]++
		}
	}
	require.Equal(t, map[string]int{sim.OpInsure: len(forwardFaults("", "")), sim.OpVoid: len(undoFaults("", ""))}, ops)
	require.Len(t, r.cfg.Faults, len(DefaultFaults())+len(InsurerFaults()))
	counts := map[string]int{}
	for n := 1; n <= 10000; n++ {
		b := r.newBooking(n)
		counts[b.kind]++
		if b.kind == KindInsurerRejects {
			require.Equal(t, r.email(KindInsurerRejects, 0), b.req.Traveler.Email)
		}
	}
	require.InDelta(t, 500, counts[KindInsurerRejects], 150, "%v", counts)
	require.InDelta(t, 6500, counts[KindOK], 300, "%v", counts)

	r, _, err = newRun(&fakeSystem{svc: "http://127.0.0.1:1", companies: map[string]string{}}, Config{Seed: 7})
	require.NoError(t, err)
	require.Len(t, r.cfg.Faults, len(DefaultFaults()), "three steps: no insurer faults")
}
