package reconciler

import (
	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/provider"
)

// clients returns the companies a sweep lists, in the order of
// [companyRecords.of]: the hotel, the card processor, the car firm and,
// with the insurance step on ([Config.Insurer]), the insurer.
func (r *Reconciler) clients() []*provider.Client {
	cs := []*provider.Client{r.cfg.Hotel, r.cfg.Payments, r.cfg.Cars}
	if r.cfg.Insurer != nil {
		cs = append(cs, r.cfg.Insurer)
	}
	return cs
}

// of returns the status counts of the i-th company of [Reconciler.clients].
func (c *companyRecords) of(i int) map[string]int {
	if i == 3 && c.policies == nil {
		c.policies = map[string]int{}
	}
	return []map[string]int{c.holds, c.charges, c.bookings, c.policies}[i]
}

// policiesAgree reports whether a settled trip's policies agree with its
// status under its own version (events.VersionExtension), not the
// reconciler's STEPS: a trip whose version has the insurance step,
// confirmed, has exactly one policy active, and canceled none (a canceled
// policy is fine); a trip whose version has no insurance step has no
// policy at all, active or canceled (a policy of it would be one the saga
// never asked for). Without the insurer listed ([Config.Insurer] nil)
// there is nothing to check.
func (r *Reconciler) policiesAgree(version string, c *companyRecords, active int) bool {
	if r.cfg.Insurer == nil {
		return true
	}
	n, all := 0, 0
	if c != nil {
		n = c.policies["active"]
		for _, k := range c.policies {
			all += k
		}
	}
	if !insured(version) {
		return all == 0
	}
	return n == active
}

// insured reports whether a trip of version has the insurance step.
func insured(version string) bool {
	c, err := events.CatalogueOf(version)
	if err != nil {
		return false
	}
	_, on := c.Step("insurance")
	return on
}

// countPolicies gives every trip's records a policy count (none yet) when
// the insurer is listed, so that a finding says "policies none".
func (r *Reconciler) countPolicies(recs map[string]*companyRecords) {
	if r.cfg.Insurer == nil {
		return
	}
	for _, c := range recs {
		c.of(3)
	}
}
