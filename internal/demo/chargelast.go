package demo

import (
	"context"
	"fmt"
	"net/url"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/sim"
)

// PivotOf returns the name of catalogue c's pivot: "car" in the default
// order, "payment" in the charge-last one (events.ChargeLast).
func PivotOf(c events.Catalogue) string {
	for _, s := range c.Saga() {
		if s.Class == events.Pivot {
			return s.Name
		}
	}
	return ""
}

// SituationsOf returns the situations of the demo for a system running
// catalogue c: [SituationsWith] of whether c has the insurance step, and,
// with the payment the pivot (charge-last), the two that undo a charge
// (there is no refund there: the card is charged last) replaced by the
// same faults on the car's cancel, which is the undo of that order.
func SituationsOf(c events.Catalogue) []Situation {
	_, insured := c.Step("insurance")
	out := SituationsWith(insured)
	if PivotOf(c) != "payment" {
		return out
	}
	for i, s := range out {
		switch s.Name {
		case "refunds fail for 30 s while undoing":
			out[i] = Situation{Name: "car cancels fail for 30 s while undoing", WantStatus: "canceled", WantVerdict: Empty, run: carCancelsFail}
		case "refunds refused for good, then settled by an operator":
			out[i] = Situation{Name: "car cancel refused for good, then settled by an operator", WantStatus: "canceled", WantVerdict: Empty, run: carCancelRefused}
		}
	}
	return out
}

// carCancelsFail (charge-last): the card is declined after the car was
// booked, and the car firm answers every cancel 503 for 30 s. The cancel
// is retried with backoff, raises compensation_stuck past its attempt
// limit (car.cancel_stuck: the hold is released meanwhile) and goes on
// until the car firm answers: the trip settles canceled, nothing booked,
// nothing charged.
func carCancelsFail(ctx context.Context, env *Env) (*Outcome, error) {
	req := env.request("cancel-fails", env.card("cancelfails"))
	if err := sim.AddFault(ctx, env.PaymentsURL, sim.Rule{Op: sim.OpCharge, Fault: sim.FaultDeclined, Match: map[string]string{"card_token": req.Payment.CardToken}}); err != nil {
		return nil, err
	}
	if err := sim.AddFault(ctx, env.CarsURL, sim.Rule{Op: sim.OpCancel, Fault: sim.FaultFail, ForMS: 30000, Match: map[string]string{"driver.email": req.Traveler.Email}}); err != nil {
		return nil, err
	}
	a, err := env.post(ctx, req, "", 10)
	if err != nil {
		return nil, err
	}
	o := &Outcome{}
	o.Notes = append(o.Notes, fmt.Sprintf("answered %d %s at %d ms", a.code, a.Status, a.ms))
	o.Trips = []TripOutcome{env.judge(ctx, a, req.Payment.CardToken)}
	o.Notes = append(o.Notes, env.incidentNotes(ctx, env.CarURL, a.TripID, "failed cancel attempts")...)
	return o, nil
}

// carCancelRefused (charge-last): the card is declined after the car was
// booked, and the car firm refuses every cancel for good (422). The
// cancel raises compensation_refused at once (car.cancel_stuck), the
// hotel releases the room anyway, and the trip stays canceling with the
// car named open. Then a person cancels the booking at the car firm by
// the trip's key and settles the car's undo as an operator (settle
// undone): the trip settles canceled, one mail.
func carCancelRefused(ctx context.Context, env *Env) (*Outcome, error) {
	if env.ReconcilerURL == "" || env.OperatorToken == "" {
		return nil, fmt.Errorf("no reconciler taking actions (ReconcilerURL and OperatorToken): the settle cannot be shown")
	}
	req := env.request("cancel-refused", env.card("cancelrefused"))
	if err := sim.AddFault(ctx, env.PaymentsURL, sim.Rule{Op: sim.OpCharge, Fault: sim.FaultDeclined, Match: map[string]string{"card_token": req.Payment.CardToken}}); err != nil {
		return nil, err
	}
	refuse, err := sim.AddFaultRule(ctx, env.CarsURL, sim.Rule{Op: sim.OpCancel, Fault: sim.FaultRefuse, Reason: "booking locked", Match: map[string]string{"driver.email": req.Traveler.Email}})
	if err != nil {
		return nil, err
	}
	a, err := env.post(ctx, req, "", 10)
	if err != nil {
		return nil, err
	}
	o := &Outcome{}
	o.Notes = append(o.Notes, fmt.Sprintf("answered %d %s at %d ms", a.code, a.Status, a.ms))
	if err := env.waitReleasedWhileOpen(ctx, a, o, "car", "the car's cancel was refused", "the car's cancel open"); err != nil {
		return o, err
	}
	// A person cancels the booking by hand, then records it.
	if _, err := sim.RemoveFault(ctx, env.CarsURL, refuse.ID); err != nil {
		return o, err
	}
	if err := env.postJSON(ctx, env.CarsURL+"/bookings/"+url.PathEscape(a.TripID+":car")+"/cancel", "", a.TripID+":car", nil); err != nil {
		return o, fmt.Errorf("the cancel by hand: %w", err)
	}
	learned, err := env.settleUndone(ctx, a, "car", "booking unlocked and canceled by hand")
	if err != nil {
		return o, err
	}
	if learned {
		o.Notes = append(o.Notes, "canceled by hand; the car service's own retry learned of it by its key before the operator's settle, which found nothing left to settle")
	} else {
		o.Notes = append(o.Notes, "canceled by hand and settled by an operator (settle, outcome undone)")
	}
	o.Trips = []TripOutcome{env.judge(ctx, a, req.Payment.CardToken)}
	return o, nil
}

// incidentNotes returns a note per incident the service at base (its own
// URL, GET /incidents) raised for trip: "incident compensation_stuck
// raised for a person; N <what> in all, retries went on". None when base
// is "" or the incidents cannot be read.
func (env *Env) incidentNotes(ctx context.Context, base, trip, what string) []string {
	if base == "" {
		return nil
	}
	var inc struct {
		Items []struct {
			TripID   string `json:"trip_id"`
			Kind     string `json:"kind"`
			Attempts int    `json:"attempts"`
		} `json:"items"`
	}
	if _, err := env.getJSON(ctx, base+"/incidents", &inc); err != nil {
		return nil
	}
	var out []string
	for _, i := range inc.Items {
		if i.TripID == trip {
			out = append(out, fmt.Sprintf("incident %s raised for a person; %d %s in all, retries went on", i.Kind, i.Attempts, what))
		}
	}
	return out
}
