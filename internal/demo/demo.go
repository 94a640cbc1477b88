// Package demo books trips in every situation the saga must survive and
// judges each against the companies' own records: whole (one hold held, one
// charge charged, one car booked), empty (nothing held, nothing charged
// without a refund line, nothing booked) or HALF. `tripsaga demo` prints
// the table; the end-to-end tests assert the same outcomes.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/services/trips"
	"github.com/tripsaga/tripsaga/sim"
)

// Verdicts.
const (
	Whole = "whole"
	Empty = "empty"
	Half  = "HALF"
)

// Env is the running system the demo talks to.
type Env struct {
	TripsURL    string
	HotelURL    string
	PaymentsURL string
	CarsURL     string
	MailURL     string
	// InsurerURL is the insurer's, with the insurance step on (its
	// policies are then judged too); "" with it off.
	InsurerURL string
	// PaymentURL is the payment service's own URL (for its incidents).
	PaymentURL string
	// CarURL is the car service's own URL (for its incidents: the car's
	// cancel is the undo of the charge-last order).
	CarURL string
	// ReconcilerURL and OperatorToken reach the reconciler's actions
	// (POST /api/actions), for the situation an operator ends.
	ReconcilerURL, OperatorToken string
	// Kill sends SIGKILL to a service process and waits until it is
	// running and ready again.
	Kill func(ctx context.Context, name string) error
	// SettleTimeout bounds the wait for a trip to settle. Defaults to 120 s.
	SettleTimeout time.Duration

	once  sync.Once
	nonce string
	http  *http.Client
}

// Situation is one scenario and what it must end in.
type Situation struct {
	Name        string
	WantStatus  string
	WantVerdict string
	run         func(ctx context.Context, env *Env) (*Outcome, error)
}

// TripOutcome is what one trip ended as, from our API and the companies.
type TripOutcome struct {
	TripID string `json:"trip_id"`
	Answer int    `json:"answer"`
	// AnswerStatus is the trip status in the POST's answer.
	AnswerStatus string `json:"answer_status"`
	AnswerMS     int64  `json:"answer_ms"`
	SettledMS    int64  `json:"settled_ms"`
	Status       string `json:"status"`
	Reason       string `json:"reason,omitempty"`
	Hold         string `json:"hold"`
	Charge       string `json:"charge"`
	Booking      string `json:"booking"`
	Charges      int    `json:"charge_lines"`
	Refunds      int    `json:"refund_lines"`
	// Mails counts the trip's final mails (its confirmation or its
	// cancellation): exactly one is right. Notices and Corrections count
	// the delay notices ("<trip>:mail:delayed") and corrections
	// ("<trip>:mail:correction") beside it (trips.MailKind).
	Mails       int    `json:"mails"`
	Notices     int    `json:"notices,omitempty"`
	Corrections int    `json:"corrections,omitempty"`
	Verdict     string `json:"verdict"`
	// Policy is the insurer's status of the trip's policy ("active",
	// "canceled", "none"), "" with the insurance step off.
	Policy string `json:"policy,omitempty"`
	// A trip canceled by the traveler: the fee and refund our API
	// announced, what the card processor says it refunded
	// (refunded_cents), and the statement's charge and refund amounts.
	// Mails then counts the cancellation emails only.
	FeeCents        int64 `json:"fee_cents,omitempty"`
	RefundCents     int64 `json:"refund_cents,omitempty"`
	RefundedCents   int64 `json:"refunded_cents,omitempty"`
	ChargedCents    int64 `json:"charged_cents,omitempty"`
	RefundLineCents int64 `json:"refund_line_cents,omitempty"`
}

// Outcome is one situation's row.
type Outcome struct {
	Situation string        `json:"situation"`
	Answer    string        `json:"answer"`
	AnswerMS  int64         `json:"answer_ms"`
	SettledMS int64         `json:"settled_ms"`
	Status    string        `json:"status"`
	Records   string        `json:"records"`
	Verdict   string        `json:"verdict"`
	Expected  string        `json:"expected"`
	OK        bool          `json:"ok"`
	Notes     []string      `json:"notes,omitempty"`
	Trips     []TripOutcome `json:"trips"`
}

// SituationsWith returns the situations of the demo, in order: with
// insurance, the insurer's too ("the insurer rejecting").
func SituationsWith(insurance bool) []Situation {
	return append([]Situation{
		{Name: "five trips, nothing wrong", WantStatus: "confirmed", WantVerdict: Whole, run: fiveTrips},
		{Name: "car sold out", WantStatus: "canceled", WantVerdict: Empty, run: carSoldOut},
		{Name: "card declined", WantStatus: "canceled", WantVerdict: Empty, run: cardDeclined},
		{Name: "payment killed (SIGKILL) after the charge", WantStatus: "confirmed", WantVerdict: Whole, run: paymentKilled},
		{Name: "car booked, answer lost", WantStatus: "confirmed", WantVerdict: Whole, run: carAnswerLost},
		{Name: "car times out, never books", WantStatus: "canceled", WantVerdict: Empty, run: carHangs},
		{Name: "refunds fail for 30 s while undoing", WantStatus: "canceled", WantVerdict: Empty, run: refundsFail},
		{Name: "refunds refused for good, then settled by an operator", WantStatus: "canceled", WantVerdict: Empty, run: refundsRefused},
		{Name: "same POST twice, one Idempotency-Key", WantStatus: "confirmed", WantVerdict: Whole, run: samePostTwice},
		{Name: "a confirmed trip canceled by the traveler inside 7 days", WantStatus: "canceled_by_traveler", WantVerdict: FeeKept, run: canceledInside7Days},
	}, insurerSituations(insurance)...)
}

// Run runs one situation against env and judges it.
func (s Situation) Run(ctx context.Context, env *Env) *Outcome {
	env.init()
	o, err := s.run(ctx, env)
	if o == nil {
		o = &Outcome{}
	}
	o.Situation = s.Name
	o.Expected = s.WantStatus + ", " + s.WantVerdict
	if err != nil {
		o.Notes = append(o.Notes, "error: "+err.Error())
	}
	o.summarize()
	o.OK = err == nil && o.Status == s.WantStatus && o.Verdict == s.WantVerdict
	return o
}

func (env *Env) init() { env.once.Do(env.setDefaults) }

func (env *Env) setDefaults() {
	if env.nonce == "" {
		env.nonce = strings.ToLower(ulid.Make().String()[16:])
	}
	if env.http == nil {
		env.http = &http.Client{Timeout: 90 * time.Second}
	}
	if env.SettleTimeout == 0 {
		env.SettleTimeout = 120 * time.Second
	}
}

// request returns a valid trip request whose traveler email and card token
// carry tag, so fault rules can single the trip out.
func (env *Env) request(tag, card string) events.TripRequest {
	if card == "" {
		card = "tok_visa_ok"
	}
	// A stay a month from today: a fixed date would fall into the past
	// and be refused.
	in := time.Now().AddDate(0, 0, 30)
	return events.TripRequest{
		Traveler: events.Person{Name: "Ada Example", Email: tag + "+" + env.nonce + "@example.com"},
		Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: in.Format(time.DateOnly), Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: in.Format(time.DateOnly), Return: in.AddDate(0, 0, 2).Format(time.DateOnly)},
		Payment:  events.PaymentRequest{CardToken: card, AmountCents: 33000, Currency: "USD"},
	}
}

func (env *Env) card(tag string) string { return "tok_" + tag + "_" + env.nonce }

type tripAnswer struct {
	code   int
	ms     int64
	start  time.Time
	TripID string `json:"trip_id"`
	Status string `json:"status"`
	Reason string `json:"reason"`
}

// post sends POST /trips with Prefer: wait=<wait s>.
func (env *Env) post(ctx context.Context, req events.TripRequest, key string, wait int) (*tripAnswer, error) {
	body, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, env.TripsURL+"/trips", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Prefer", "wait="+strconv.Itoa(wait))
	if key != "" {
		hr.Header.Set("Idempotency-Key", key)
	}
	start := time.Now()
	resp, err := env.http.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("POST /trips: %w", err)
	}
	defer resp.Body.Close()
	a := &tripAnswer{code: resp.StatusCode, ms: time.Since(start).Milliseconds(), start: start}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusAccepted {
		return a, fmt.Errorf("POST /trips: %d %s", resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, a); err != nil {
		return a, fmt.Errorf("POST /trips: %w", err)
	}
	return a, nil
}

func (env *Env) getJSON(ctx context.Context, u string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := env.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if v != nil {
		_ = json.NewDecoder(resp.Body).Decode(v)
	}
	return resp.StatusCode, nil
}

// trip returns GET /trips/{id}.
func (env *Env) trip(ctx context.Context, id string) (*tripAnswer, error) {
	var a tripAnswer
	code, err := env.getJSON(ctx, env.TripsURL+"/trips/"+url.PathEscape(id), &a)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET /trips/%s: %d", id, code)
	}
	return &a, nil
}

// settle waits until the trip is confirmed or canceled (or SettleTimeout).
func (env *Env) settle(ctx context.Context, a *tripAnswer) (*tripAnswer, int64) {
	deadline := time.Now().Add(env.SettleTimeout)
	for {
		cur, err := env.trip(ctx, a.TripID)
		if err == nil && (cur.Status == "confirmed" || cur.Status == "canceled") {
			return cur, time.Since(a.start).Milliseconds()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if cur == nil {
				cur = a
			}
			return cur, time.Since(a.start).Milliseconds()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// judge settles a trip and reads the companies' records of it.
func (env *Env) judge(ctx context.Context, a *tripAnswer, card string) TripOutcome {
	cur, settledMS := env.settle(ctx, a)
	t := TripOutcome{TripID: a.TripID, Answer: a.code, AnswerStatus: a.Status, AnswerMS: a.ms, SettledMS: settledMS, Status: cur.Status, Reason: cur.Reason}
	// The mail is sent just after the trip settles: give it a moment.
	for i := 0; i < 50; i++ {
		env.Records(ctx, &t, card)
		if t.Mails > 0 || (cur.Status != "confirmed" && cur.Status != "canceled") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return t
}

// Records reads what the companies hold of the trip t.TripID, paid with
// card: its hold, charge and booking by key (GET /holds/{T:hotel},
// /charges/{T:charge}, /bookings/{T:car}: a status word, "none" or
// "error"), the card statement's charge and refund lines of the trip, and
// the mails sent for it (GET /messages?trip_id=T). It fills those fields
// of t and its Verdict (from t.Status, which the caller sets).
func (env *Env) Records(ctx context.Context, t *TripOutcome, card string) {
	env.init()
	status := func(base, res, key string) string {
		var v struct {
			Status string `json:"status"`
		}
		code, err := env.getJSON(ctx, base+"/"+res+"/"+url.PathEscape(key), &v)
		switch {
		case err != nil:
			return "error"
		case code == http.StatusNotFound:
			return "none"
		case code != http.StatusOK:
			return "error"
		}
		return v.Status
	}
	t.Hold = status(env.HotelURL, "holds", t.TripID+":hotel")
	t.Charge = status(env.PaymentsURL, "charges", t.TripID+":charge")
	t.Booking = status(env.CarsURL, "bookings", t.TripID+":car")
	if env.InsurerURL != "" {
		t.Policy = status(env.InsurerURL, "policies", t.TripID+":insurance")
	}
	var st struct {
		Lines []struct {
			TripID string `json:"trip_id"`
			Kind   string `json:"kind"`
		} `json:"lines"`
	}
	t.Charges, t.Refunds = 0, 0
	if _, err := env.getJSON(ctx, env.PaymentsURL+"/statements/"+url.PathEscape(card), &st); err == nil {
		for _, l := range st.Lines {
			if l.TripID != t.TripID {
				continue
			}
			if l.Kind == "charge" {
				t.Charges++
			} else if l.Kind == "refund" {
				t.Refunds++
			}
		}
	}
	var msgs struct {
		Items []struct {
			Key string `json:"key"`
		} `json:"items"`
	}
	if _, err := env.getJSON(ctx, env.MailURL+"/messages?trip_id="+url.QueryEscape(t.TripID), &msgs); err == nil {
		t.Mails, t.Notices, t.Corrections = CountMails(keysOf(msgs.Items))
	}
	if t.Status == "canceled_by_traveler" {
		env.cancellationRecords(ctx, t, card)
	}
	t.Verdict = Verdict(*t)
}

// CountMails counts a trip's mails by their mail relay keys: its final
// mails (confirmation or cancellation, of which exactly one is right), its
// delay notices and its corrections (trips.MailKind).
func CountMails(keys []string) (final, notices, corrections int) {
	for _, k := range keys {
		switch trips.MailKind(k) {
		case "notice":
			notices++
		case "correction":
			corrections++
		default:
			final++
		}
	}
	return final, notices, corrections
}

func keysOf(items []struct {
	Key string `json:"key"`
},
) []string {
	keys := make([]string, 0, len(items))
	for _, m := range items {
		keys = append(keys, m.Key)
	}
	return keys
}

// Verdict judges one trip from the companies' records and its status:
// whole when confirmed with the hold held, the card charged once and never
// refunded, and the car booked; empty when canceled with nothing held, no
// charge left without a refund line and nothing booked; HALF otherwise.
func Verdict(t TripOutcome) string {
	whole := t.Hold == "held" && t.Charge == "charged" && t.Booking == "booked" && t.Charges == 1 && t.Refunds == 0
	empty := t.Hold != "held" && t.Charge != "charged" && t.Booking != "booked" && t.Charges == t.Refunds
	switch {
	case t.Status == "confirmed" && whole && policyAgrees(t, Whole):
		return Whole
	case t.Status == "canceled" && empty && policyAgrees(t, Empty):
		return Empty
	case t.Status == "canceled_by_traveler" && feeKept(t):
		return FeeKept
	}
	return Half
}

func (o *Outcome) summarize() {
	if len(o.Trips) == 0 {
		o.Verdict = Half
		return
	}
	count := func(f func(TripOutcome) string) string {
		m := map[string]int{}
		var order []string
		for _, t := range o.Trips {
			k := f(t)
			if m[k] == 0 {
				order = append(order, k)
			}
			m[k]++
		}
		var parts []string
		for _, k := range order {
			if m[k] > 1 {
				parts = append(parts, fmt.Sprintf("%s ×%d", k, m[k]))
			} else {
				parts = append(parts, k)
			}
		}
		return strings.Join(parts, ", ")
	}
	o.Answer = count(func(t TripOutcome) string { return strconv.Itoa(t.Answer) })
	o.Status = count(func(t TripOutcome) string { return t.Status })
	o.Verdict = Whole
	for _, t := range o.Trips {
		o.AnswerMS = max(o.AnswerMS, t.AnswerMS)
		o.SettledMS = max(o.SettledMS, t.SettledMS)
	}
	if len(o.Trips) > 1 {
		o.Status = count(func(t TripOutcome) string { return t.Status })
	}
	verdicts := count(func(t TripOutcome) string { return t.Verdict })
	o.Verdict = verdicts
	if strings.Contains(verdicts, ",") {
		o.Verdict = Half
	} else if i := strings.Index(verdicts, " ×"); i > 0 {
		o.Verdict = verdicts[:i]
	}
	if st := o.Status; strings.Contains(st, " ×") && !strings.Contains(st, ",") {
		o.Status = st[:strings.Index(st, " ×")]
	}
	o.Records = count(func(t TripOutcome) string {
		r := fmt.Sprintf("hold %s; charge %s (%d charge/%d refund lines); car %s; %d mail", t.Hold, t.Charge, t.Charges, t.Refunds, t.Booking, t.Mails)
		r += policyNote(t)
		if t.Status == "canceled_by_traveler" {
			r = strings.Replace(r, " mail", " cancellation mail", 1)
			r += fmt.Sprintf("; %d charged, %d refunded, fee %d kept", t.ChargedCents, t.RefundedCents, t.ChargedCents-t.RefundedCents)
		}
		return r
	})
}

// single posts one trip and judges it.
func single(ctx context.Context, env *Env, req events.TripRequest, wait int) (*Outcome, error) {
	a, err := env.post(ctx, req, "", wait)
	if err != nil {
		return nil, err
	}
	o := &Outcome{Trips: []TripOutcome{env.judge(ctx, a, req.Payment.CardToken)}}
	if o.Trips[0].Reason != "" {
		o.Notes = append(o.Notes, "reason: "+o.Trips[0].Reason)
	}
	return o, nil
}

func fiveTrips(ctx context.Context, env *Env) (*Outcome, error) {
	trips := make([]TripOutcome, 5)
	errs := make([]error, 5)
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := env.request("ok"+strconv.Itoa(i), "")
			a, err := env.post(ctx, req, "", 30)
			if err != nil {
				errs[i] = err
				return
			}
			trips[i] = env.judge(ctx, a, req.Payment.CardToken)
		}()
	}
	wg.Wait()
	return &Outcome{Trips: trips}, errors.Join(errs...)
}

func carSoldOut(ctx context.Context, env *Env) (*Outcome, error) {
	req := env.request("car-sold-out", env.card("carsoldout"))
	if err := sim.AddFault(ctx, env.CarsURL, sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut, Match: map[string]string{"driver.email": req.Traveler.Email}}); err != nil {
		return nil, err
	}
	return single(ctx, env, req, 30)
}

func cardDeclined(ctx context.Context, env *Env) (*Outcome, error) {
	req := env.request("declined", env.card("declined"))
	if err := sim.AddFault(ctx, env.PaymentsURL, sim.Rule{Op: sim.OpCharge, Fault: sim.FaultDeclined, Match: map[string]string{"card_token": req.Payment.CardToken}}); err != nil {
		return nil, err
	}
	return single(ctx, env, req, 30)
}

func paymentKilled(ctx context.Context, env *Env) (*Outcome, error) {
	req := env.request("killed", env.card("killed"))
	// The card processor commits the charge at once and answers 1.5 s later:
	// the payment service is killed while it waits for that answer.
	if err := sim.AddFault(ctx, env.PaymentsURL, sim.Rule{Op: sim.OpCharge, Fault: sim.FaultSlowAnswer, DelayMS: 1500, Times: 1, Match: map[string]string{"card_token": req.Payment.CardToken}}); err != nil {
		return nil, err
	}
	a, err := env.post(ctx, req, "", 0)
	if err != nil {
		return nil, err
	}
	key := a.TripID + ":charge"
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, err := env.getJSON(ctx, env.PaymentsURL+"/charges/"+url.PathEscape(key), nil)
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the charge %s never appeared", key)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if env.Kill == nil {
		return nil, fmt.Errorf("no way to kill the payment process")
	}
	if err := env.Kill(ctx, "payment"); err != nil {
		return nil, err
	}
	o := &Outcome{Trips: []TripOutcome{env.judge(ctx, a, req.Payment.CardToken)}}
	o.Notes = append(o.Notes, "payment SIGKILLed after the charge committed, restarted, recovered by key")
	return o, nil
}

func carAnswerLost(ctx context.Context, env *Env) (*Outcome, error) {
	req := env.request("car-lost", env.card("carlost"))
	if err := sim.AddFault(ctx, env.CarsURL, sim.Rule{Op: sim.OpBook, Fault: sim.FaultLoseAnswer, Times: 1, Match: map[string]string{"driver.email": req.Traveler.Email}}); err != nil {
		return nil, err
	}
	return single(ctx, env, req, 30)
}

func carHangs(ctx context.Context, env *Env) (*Outcome, error) {
	req := env.request("car-hangs", env.card("carhangs"))
	if err := sim.AddFault(ctx, env.CarsURL, sim.Rule{Op: sim.OpBook, Fault: sim.FaultHang, DelayMS: 60000, Match: map[string]string{"driver.email": req.Traveler.Email}}); err != nil {
		return nil, err
	}
	return single(ctx, env, req, 30)
}

func refundsFail(ctx context.Context, env *Env) (*Outcome, error) {
	req := env.request("refund-fails", env.card("refundfails"))
	if err := sim.AddFault(ctx, env.CarsURL, sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut, Match: map[string]string{"driver.email": req.Traveler.Email}}); err != nil {
		return nil, err
	}
	if err := sim.AddFault(ctx, env.PaymentsURL, sim.Rule{Op: sim.OpRefund, Fault: sim.FaultFail, ForMS: 30000, Match: map[string]string{"card_token": req.Payment.CardToken}}); err != nil {
		return nil, err
	}
	a, err := env.post(ctx, req, "", 10)
	if err != nil {
		return nil, err
	}
	o := &Outcome{}
	o.Notes = append(o.Notes, fmt.Sprintf("answered %d %s at %d ms", a.code, a.Status, a.ms))
	t := env.judge(ctx, a, req.Payment.CardToken)
	o.Trips = []TripOutcome{t}
	if env.PaymentURL != "" {
		var inc struct {
			Items []struct {
				TripID   string `json:"trip_id"`
				Kind     string `json:"kind"`
				Attempts int    `json:"attempts"`
			} `json:"items"`
		}
		if _, err := env.getJSON(ctx, env.PaymentURL+"/incidents", &inc); err == nil {
			for _, i := range inc.Items {
				if i.TripID == a.TripID {
					o.Notes = append(o.Notes, fmt.Sprintf("incident %s raised for a person; %d failed refund attempts in all, retries went on", i.Kind, i.Attempts))
				}
			}
		}
	}
	return o, nil
}

func samePostTwice(ctx context.Context, env *Env) (*Outcome, error) {
	req := env.request("twice", env.card("twice"))
	key := "demo-" + env.nonce
	var wg sync.WaitGroup
	answers := make([]*tripAnswer, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); answers[i], errs[i] = env.post(ctx, req, key, 30) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	o := &Outcome{Trips: []TripOutcome{env.judge(ctx, answers[0], req.Payment.CardToken)}}
	o.Notes = append(o.Notes, fmt.Sprintf("both answers name trip %s and %s", answers[0].TripID, answers[1].TripID))
	if answers[0].TripID != answers[1].TripID {
		o.Trips = append(o.Trips, env.judge(ctx, answers[1], req.Payment.CardToken))
		o.Trips[0].Verdict = Half
	}
	return o, nil
}
