package demo

import (
	"context"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/sim"
)

// InsuranceOn reports whether catalogue c (STEPS') has the optional
// insurance step: the demo then judges the insurer's policy too and adds
// the insurer's situation.
func InsuranceOn(c events.Catalogue) bool {
	_, on := c.Step("insurance")
	return on
}

// insurerSituations returns the situations of the insurance step: none
// when it is off.
func insurerSituations(on bool) []Situation {
	if !on {
		return nil
	}
	return []Situation{
		{Name: "the insurer rejecting", WantStatus: "canceled", WantVerdict: Empty, run: insurerRejects},
	}
}

// insurerRejects: the insurer refuses the risk (409 rejected), so the trip
// is canceled after the hold: the hold is released and the card never
// charged.
func insurerRejects(ctx context.Context, env *Env) (*Outcome, error) {
	req := env.request("insurer-rejects", env.card("insurerrejects"))
	rule := sim.Rule{Op: sim.OpInsure, Fault: sim.FaultRejected, Match: map[string]string{"traveler.email": req.Traveler.Email}}
	if err := sim.AddFault(ctx, env.InsurerURL, rule); err != nil {
		return nil, err
	}
	return single(ctx, env, req, 30)
}

// policyAgrees reports whether the insurer's record of t agrees with a
// verdict: with the step off (Policy "") always; whole wants the policy
// active, empty wants none in force.
func policyAgrees(t TripOutcome, verdict string) bool {
	switch {
	case t.Policy == "":
		return true
	case verdict == Whole:
		return t.Policy == "active"
	default:
		return t.Policy != "active"
	}
}

// policyNote is the insurer's part of a trip's records ("; policy
// active"), "" with the step off.
func policyNote(t TripOutcome) string {
	if t.Policy == "" {
		return ""
	}
	return "; policy " + t.Policy
}
