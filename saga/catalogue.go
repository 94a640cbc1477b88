package saga

import (
	"fmt"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/provider"
)

// SpecOf returns the [Spec] of the step named name in catalogue c, calling
// the company c: its name, service and class, and its event types as the
// catalogue declares them (the step's Publishes are done, rejected and
// failed, in that order; its compensation's first is undone, its Stuck
// (or the pivot's own, events.Step.Stuck) the stuck event), so a step
// declared in the catalogue needs nothing else restated. The error names a
// step c lacks or one that does not publish those three.
func SpecOf(c events.Catalogue, name string, company *provider.Client) (Spec, error) {
	st, ok := c.Step(name)
	if !ok {
		return Spec{}, fmt.Errorf("saga: the catalogue has no step %q (is it in STEPS?)", name)
	}
	if len(st.Publishes) != 3 {
		return Spec{}, fmt.Errorf("saga: step %s publishes %d event types, want done, rejected and failed", name, len(st.Publishes))
	}
	spec := Spec{
		Name: st.Name, Service: st.Service, Class: st.Class, Company: company, ActiveStatus: company.ActiveStatus,
		OnDone: st.Publishes[0], OnRejected: st.Publishes[1], OnFailed: st.Publishes[2],
	}
	if st.Compensation != nil && len(st.Compensation.Publishes) > 0 {
		spec.OnUndone = st.Compensation.Publishes[0]
	}
	spec.OnStuck = st.StuckType()
	return spec, nil
}
