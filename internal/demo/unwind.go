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
	"slices"
	"strings"
	"time"

	"github.com/tripsaga/tripsaga/sim"
)

// refundsRefused: the car is sold out and the card processor refuses
// every refund for good (422 card closed). The refund raises
// compensation_refused at once and goes on being retried; the hotel
// releases the room anyway (payment.refund_stuck), and the trip stays
// canceling with the payment named open. Then a person refunds the card
// outside the system (here: the card processor's refund by the trip's
// key, once the card is reopened) and settles the refund as an operator
// (POST /api/actions, settle undone): the trip settles canceled, one mail.
func refundsRefused(ctx context.Context, env *Env) (*Outcome, error) {
	if env.ReconcilerURL == "" || env.OperatorToken == "" {
		return nil, fmt.Errorf("no reconciler taking actions (ReconcilerURL and OperatorToken): the settle cannot be shown")
	}
	req := env.request("refund-refused", env.card("refundrefused"))
	if err := sim.AddFault(ctx, env.CarsURL, sim.Rule{Op: sim.OpBook, Fault: sim.FaultSoldOut, Match: map[string]string{"driver.email": req.Traveler.Email}}); err != nil {
		return nil, err
	}
	refuse, err := sim.AddFaultRule(ctx, env.PaymentsURL, sim.Rule{Op: sim.OpRefund, Fault: sim.FaultRefuse, Reason: "card closed", Match: map[string]string{"card_token": req.Payment.CardToken}})
	if err != nil {
		return nil, err
	}
	a, err := env.post(ctx, req, "", 10)
	if err != nil {
		return nil, err
	}
	o := &Outcome{}
	o.Notes = append(o.Notes, fmt.Sprintf("answered %d %s at %d ms", a.code, a.Status, a.ms))
	if err := env.waitReleasedWhileOpen(ctx, a, o, "payment", "the refund was refused", "the refund open"); err != nil {
		return o, err
	}
	// A person refunds the card by hand, then records it.
	if _, err := sim.RemoveFault(ctx, env.PaymentsURL, refuse.ID); err != nil {
		return o, err
	}
	if err := env.postJSON(ctx, env.PaymentsURL+"/charges/"+url.PathEscape(a.TripID+":charge")+"/refund", "", a.TripID+":charge", nil); err != nil {
		return o, fmt.Errorf("the refund by hand: %w", err)
	}
	learned, err := env.settleUndone(ctx, a, "payment", "card reopened and refunded by hand")
	if err != nil {
		return o, err
	}
	if learned {
		o.Notes = append(o.Notes, "refunded by hand; the payment service's own retry learned of it by its key before the operator's settle, which found nothing left to settle")
	} else {
		o.Notes = append(o.Notes, "refunded by hand and settled by an operator (settle, outcome undone)")
	}
	o.Trips = []TripOutcome{env.judge(ctx, a, req.Payment.CardToken)}
	return o, nil
}

// postJSON posts body (nil: none) to u with the bearer token (if any)
// and the Idempotency-Key key, and wants a 2xx.
func (env *Env) postJSON(ctx context.Context, u, token, key string, body any) error {
	var rd io.Reader = http.NoBody
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := env.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return &statusError{url: u, code: resp.StatusCode, body: string(raw)}
	}
	return nil
}

// statusError is a POST answered with a status other than 2xx.
type statusError struct {
	url  string
	code int
	body string // the first 4 KiB
}

func (e *statusError) Error() string { return fmt.Sprintf("POST %s: %d %s", e.url, e.code, e.body) }

// waitReleasedWhileOpen waits (at most env.SettleTimeout) until trip a's
// room is released while the trip names open as its one open undo, and
// notes when ("room released at N ms while <while>"); otherwise an error
// naming what was seen instead ("with <with>").
func (env *Env) waitReleasedWhileOpen(ctx context.Context, a *tripAnswer, o *Outcome, open, while, with string) error {
	var cur struct {
		Status   string   `json:"status"`
		OpenUndo []string `json:"open_undo"`
	}
	deadline := time.Now().Add(env.SettleTimeout)
	for {
		var hold struct {
			Status string `json:"status"`
		}
		_, _ = env.getJSON(ctx, env.HotelURL+"/holds/"+url.PathEscape(a.TripID+":hotel"), &hold)
		_, _ = env.getJSON(ctx, env.TripsURL+"/trips/"+url.PathEscape(a.TripID), &cur)
		if hold.Status == "released" && slices.Equal(cur.OpenUndo, []string{open}) {
			o.Notes = append(o.Notes, fmt.Sprintf("room released at %d ms while %s; trip %s, open undo: %s", time.Since(a.start).Milliseconds(), while, cur.Status, open))
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the room was not released with %s (hold %s, trip %s, open undo %v)", with, hold.Status, cur.Status, cur.OpenUndo)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// settleUndone records, as the demo's operator (POST /api/actions, action
// settle, outcome undone), that a person did service's undo of trip a by
// hand, for reason. learned is true when the service had already learned
// of the undo by its key (its own retry asked the company, which the
// person's undo by the same key had answered): the reconciler refuses the
// settle then (409, "done already"), and nothing is left to settle.
func (env *Env) settleUndone(ctx context.Context, a *tripAnswer, service, reason string) (learned bool, err error) {
	err = env.postJSON(ctx, env.ReconcilerURL+"/api/actions", env.OperatorToken, "demo-settle-"+a.TripID, map[string]string{
		"action": "settle", "trip": a.TripID, "service": service, "outcome": "undone",
		"reason": reason, "operator": "demo",
	})
	var se *statusError
	if errors.As(err, &se) && se.code == http.StatusConflict && strings.Contains(se.body, "done already") {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("settle: %w", err)
	}
	return false, nil
}
