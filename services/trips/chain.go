package trips

import (
	"slices"
	"strings"

	"github.com/tripsaga/tripsaga/events"
)

// project derives a trip's status from the kinds seen, following the saga
// of catalogue c (its compensable steps and pivot, in order; see
// [Project]): confirmed once the pivot is done; pending while no step
// ended without being done; canceled once every compensable step that
// happened (its done event, or any event of a later step, was seen) has
// ended (rejected, failed) or been compensated; canceling otherwise.
func project(c events.Catalogue, seen []string) string {
	has := func(typ string) bool { return slices.Contains(seen, events.Kind(typ)) }
	anyOf := func(ts []string) bool { return slices.ContainsFunc(ts, has) }
	chain := c.Saga()
	if len(chain) == 0 {
		return StatusPending
	}
	if has(chain[len(chain)-1].Done()) {
		return StatusConfirmed
	}
	failed := false
	for _, s := range chain {
		failed = failed || anyOf(s.Publishes[1:])
	}
	if !failed {
		return StatusPending
	}
	later := false // an event of a later step was seen
	for _, s := range slices.Backward(chain) {
		happened := has(s.Done()) || later
		if s.Compensation != nil && happened && !anyOf(ended(s)) {
			return StatusCanceling
		}
		later = later || anyOf(append(slices.Clone(s.Publishes), compensated(s)...))
	}
	return StatusCanceled
}

// ended returns the event types after which step s holds nothing: it was
// rejected, it failed (and was undone by key), or it was compensated.
func ended(s events.Step) []string { return append(slices.Clone(s.Publishes[1:]), compensated(s)...) }

func compensated(s events.Step) []string {
	if s.Compensation == nil {
		return nil
	}
	return s.Compensation.Publishes
}

// addSteps adds to m the state of each step of c's saga that m lacks (an
// optional step: "insurance"): the verb of the latest of its compensation,
// failed, rejected and done events seen ("canceled", "failed",
// "rejected", "bought"), else pick's answer for nothing seen.
func addSteps(m map[string]string, c events.Catalogue, pick func(order ...string) string) {
	for _, s := range c.Saga() {
		if _, ok := m[s.Name]; ok {
			continue
		}
		var order []string
		for _, typ := range slices.Backward(append(slices.Clone(s.Publishes), compensated(s)...)) {
			kind := events.Kind(typ)
			_, verb, _ := strings.Cut(kind, ".")
			order = append(order, kind, verb)
		}
		m[s.Name] = pick(order...)
	}
}
