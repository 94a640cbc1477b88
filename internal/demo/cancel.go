package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/tripsaga/tripsaga/services/trips"
)

// FeeKept is the verdict of a trip the traveler canceled when the
// companies' records agree with it: nothing held, nothing booked, the
// charge refunded by exactly the charge minus the fee (one refund line of
// that amount; none when the fee is the whole charge), and one
// cancellation email. (No comma: a situation's row joins its trips'
// verdicts with commas.)
const FeeKept = "fee kept; rest refunded"

// cancelAnswer is the part of POST /trips/{id}/cancellation's answer the
// demo reads.
type cancelAnswer struct {
	code         int
	ms           int64
	Status       string `json:"status"`
	Cancellation *struct {
		FeeCents    int64  `json:"fee_cents"`
		RefundCents int64  `json:"refund_cents"`
		Band        string `json:"band"`
	} `json:"cancellation"`
}

// CancelTrip sends POST /trips/{id}/cancellation with key and
// Prefer: wait=<wait s>, and returns the HTTP status code, the trip's
// status and its cancellation's fee and refund (minor units) as answered.
func (env *Env) CancelTrip(ctx context.Context, id, key string, wait int) (code int, status string, fee, refund int64, err error) {
	a, err := env.cancel(ctx, id, key, wait)
	if err != nil {
		return 0, "", 0, 0, err
	}
	if a.Cancellation != nil {
		fee, refund = a.Cancellation.FeeCents, a.Cancellation.RefundCents
	}
	return a.code, a.Status, fee, refund, nil
}

func (env *Env) cancel(ctx context.Context, id, key string, wait int) (*cancelAnswer, error) {
	env.init()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, env.TripsURL+"/trips/"+url.PathEscape(id)+"/cancellation", bytes.NewReader(nil))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Idempotency-Key", key)
	hr.Header.Set("Prefer", "wait="+strconv.Itoa(wait))
	start := time.Now()
	resp, err := env.http.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("POST /trips/%s/cancellation: %w", id, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := &cancelAnswer{code: resp.StatusCode, ms: time.Since(start).Milliseconds()}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		return a, fmt.Errorf("POST /trips/%s/cancellation: %d %s", id, resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, a); err != nil {
		return a, fmt.Errorf("POST /trips/%s/cancellation: %w", id, err)
	}
	return a, nil
}

// JudgeCancellation waits (up to SettleTimeout) until the trip id is
// canceled_by_traveler and judges it from the companies' records
// ([Env.Records]): FeeKept when they agree with the fee and refund our API
// announced (fee, refund), HALF otherwise.
func (env *Env) JudgeCancellation(ctx context.Context, id, card string, fee, refund int64) TripOutcome {
	env.init()
	start := time.Now()
	deadline := start.Add(env.SettleTimeout)
	t := TripOutcome{TripID: id, FeeCents: fee, RefundCents: refund}
	for {
		cur, err := env.trip(ctx, id)
		if err == nil {
			t.Status = cur.Status
		}
		if t.Status == trips.StatusCanceledByTraveler || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.SettledMS = time.Since(start).Milliseconds()
	for i := 0; i < 50; i++ { // the email follows the status
		env.Records(ctx, &t, card)
		if t.Mails > 0 || t.Status != trips.StatusCanceledByTraveler {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return t
}

// canceledInside7Days books a trip whose check-in is 3 days away (inside
// 7 days, not inside 48 hours), waits until it is confirmed, then cancels
// it as the traveler: 50 % of one night is kept, the rest refunded, the
// hold released, the car canceled, one cancellation email.
func canceledInside7Days(ctx context.Context, env *Env) (*Outcome, error) {
	req := env.request("traveler-cancels", env.card("travelercancels"))
	in := time.Now().UTC().AddDate(0, 0, 3)
	req.Hotel.CheckIn = in.Format(time.DateOnly)
	req.Car.Pickup, req.Car.Return = req.Hotel.CheckIn, in.AddDate(0, 0, 2).Format(time.DateOnly)
	a, err := env.post(ctx, req, "", 30)
	if err != nil {
		return nil, err
	}
	if cur, _ := env.settle(ctx, a); cur.Status != trips.StatusConfirmed {
		return nil, fmt.Errorf("trip %s is %s, not confirmed: nothing to cancel", a.TripID, cur.Status)
	}
	c, err := env.cancel(ctx, a.TripID, "cancel-"+a.TripID, 30)
	if err != nil {
		return nil, err
	}
	if c.Cancellation == nil {
		return nil, fmt.Errorf("the cancellation's answer has no cancellation")
	}
	want := trips.DefaultPolicy().Fee(req.Payment.AmountCents, req.Hotel.Nights, in, time.Now())
	t := env.JudgeCancellation(ctx, a.TripID, req.Payment.CardToken, c.Cancellation.FeeCents, c.Cancellation.RefundCents)
	t.Answer, t.AnswerStatus, t.AnswerMS = c.code, c.Status, c.ms
	t.SettledMS += c.ms // from the cancellation's POST
	o := &Outcome{Trips: []TripOutcome{t}}
	o.Notes = append(o.Notes, fmt.Sprintf("band %q: fee %d of %d charged, %d refunded (the policy says %d)",
		c.Cancellation.Band, c.Cancellation.FeeCents, req.Payment.AmountCents, c.Cancellation.RefundCents, want.FeeCents))
	if c.Cancellation.FeeCents != want.FeeCents || c.Cancellation.FeeCents == 0 {
		o.Trips[0].Verdict = Half
		o.Notes = append(o.Notes, "the fee is not 50 % of one night")
	}
	return o, nil
}

// cancellationRecords fills what a canceled-by-traveler verdict needs
// beyond the common records: the charge's refunded_cents and the trip's
// statement amounts, and counts only the cancellation email as t.Mails.
func (env *Env) cancellationRecords(ctx context.Context, t *TripOutcome, card string) {
	var ch struct {
		RefundedCents int64 `json:"refunded_cents"`
	}
	if _, err := env.getJSON(ctx, env.PaymentsURL+"/charges/"+url.PathEscape(t.TripID+":charge"), &ch); err == nil {
		t.RefundedCents = ch.RefundedCents
	}
	var st struct {
		Lines []struct {
			TripID      string `json:"trip_id"`
			Kind        string `json:"kind"`
			AmountCents int64  `json:"amount_cents"`
		} `json:"lines"`
	}
	t.ChargedCents, t.RefundLineCents = 0, 0
	if _, err := env.getJSON(ctx, env.PaymentsURL+"/statements/"+url.PathEscape(card), &st); err == nil {
		for _, l := range st.Lines {
			if l.TripID != t.TripID {
				continue
			}
			n := max(l.AmountCents, -l.AmountCents)
			if l.Kind == "charge" {
				t.ChargedCents += n
			} else {
				t.RefundLineCents += n
			}
		}
	}
	var msgs struct {
		Items []struct {
			Key  string `json:"key"`
			Text string `json:"text"`
		} `json:"items"`
	}
	t.Mails = 0
	if _, err := env.getJSON(ctx, env.MailURL+"/messages?trip_id="+url.QueryEscape(t.TripID), &msgs); err == nil {
		for _, m := range msgs.Items {
			if strings.HasSuffix(m.Key, ":mail:"+trips.StatusCanceledByTraveler) && strings.Contains(m.Text, "Cancellation fee") {
				t.Mails++
			}
		}
	}
}

// feeKept reports whether the records of a trip canceled by the traveler
// agree with its fee and refund (see [FeeKept]).
func feeKept(t TripOutcome) bool {
	refunded := t.Refunds == 1 && t.Charge == "refunded" && t.RefundedCents == t.RefundCents && t.RefundLineCents == t.RefundCents
	if t.RefundCents == 0 {
		refunded = t.Refunds == 0 && t.Charge == "charged"
	}
	return t.Hold != "held" && t.Booking != "booked" && t.Policy != "active" && t.Charges == 1 && refunded &&
		t.FeeCents >= 0 && t.RefundCents >= 0 && t.FeeCents+t.RefundCents == t.ChargedCents && t.Mails == 1
}
