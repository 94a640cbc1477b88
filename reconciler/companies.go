package reconciler

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/provider"
)

// company is one company the sweep lists, by the step whose company it is.
type company struct {
	step string
	c    *provider.Client
}

// companies returns the companies of [Config.Companies] in the order of
// the steps of every version of the saga (events.Full: the trip's hotel,
// insurer, payments, cars): the order the findings name them in.
func (r *Reconciler) companies() []company {
	var out []company
	for _, s := range events.Full().Steps {
		if c := r.cfg.Companies[s.Name]; c != nil {
			out = append(out, company{step: s.Name, c: c})
		}
	}
	for _, step := range slices.Sorted(maps.Keys(r.cfg.Companies)) { // a step of no version: last
		if _, ok := events.Full().Step(step); !ok && r.cfg.Companies[step] != nil {
			out = append(out, company{step: step, c: r.cfg.Companies[step]})
		}
	}
	return out
}

// clients returns the clients of [Reconciler.companies], in that order.
func (r *Reconciler) clients() []*provider.Client {
	var out []*provider.Client
	for _, c := range r.companies() {
		out = append(out, c.c)
	}
	return out
}

// of returns the status counts of the records of step's company.
func (c *companyRecords) of(step string) map[string]int {
	if c.by == nil {
		c.by = map[string]map[string]int{}
	}
	if c.by[step] == nil {
		c.by[step] = map[string]int{}
	}
	return c.by[step]
}

// agree reports whether a settled trip's records agree with its status
// under its own version (events.VersionExtension), not the reconciler's
// STEPS: for each company listed, a step of the trip's version has exactly
// active records in force (its company's ActiveStatus: 1 confirmed, 0
// canceled; an undone one is fine), and a step the trip's version does not
// have has no record at all, in force or undone (one would be a record the
// saga never asked for).
func (r *Reconciler) agree(version string, c *companyRecords, active int) bool {
	cat, err := events.CatalogueOf(version)
	if err != nil {
		cat = r.cfg.Catalogue
	}
	if c == nil {
		c = &companyRecords{}
	}
	for _, co := range r.companies() {
		by := c.by[co.step]
		if _, in := cat.Step(co.step); !in {
			for _, n := range by {
				if n > 0 {
					return false
				}
			}
			continue
		}
		if by[co.c.ActiveStatus] != active {
			return false
		}
	}
	return true
}

// travelerHalf says what a trip canceled by the traveler left at the
// companies ("" when nothing): a record still in force at any company (a
// hold held, a booking booked, a policy active), or, at the company of
// [Config.RefundStep], a charge not refunded by exactly refund (charge
// minus fee; a charge left charged only when refund is 0, the fee being
// the whole charge).
func (r *Reconciler) travelerHalf(c *companyRecords, refund int64) string {
	if c == nil {
		c = &companyRecords{}
	}
	var why []string
	var partial *company
	for _, co := range r.companies() {
		if co.step == r.cfg.RefundStep {
			partial = &co
			continue
		}
		if c.by[co.step][co.c.ActiveStatus] > 0 {
			why = append(why, fmt.Sprintf("a %s is still %s", singular(co.c.Resource), co.c.ActiveStatus))
		}
	}
	if partial != nil {
		switch {
		case refund > 0 && c.by[partial.step][partial.c.ActiveStatus] > 0:
			why = append(why, fmt.Sprintf("the %s is not refunded (%d due)", singular(partial.c.Resource), refund))
		case c.refunded != refund:
			why = append(why, fmt.Sprintf("%d refunded, not the %d due", c.refunded, refund))
		}
	}
	return strings.Join(why, ", ")
}

// singular is a company's collection name in the singular ("holds" →
// "hold", "policies" → "policy").
func singular(resource string) string {
	if s, ok := strings.CutSuffix(resource, "ies"); ok {
		return s + "y"
	}
	return strings.TrimSuffix(resource, "s")
}
