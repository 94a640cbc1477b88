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
// happened (its done event, its stuck event, or any event of a later
// step, was seen: the later step ran only because it was done) has ended
// (rejected, failed) or been compensated; canceling otherwise, with the
// open undos: the steps whose undo raised its incident (its stuck event,
// events.Compensation.Stuck) and is not done yet, newest first. The steps
// before an open undo are undone meanwhile; the trip settles canceled
// when the last undo is done.
func project(c events.Catalogue, seen []string) (status string, open []string) {
	has := func(typ string) bool { return typ != "" && slices.Contains(seen, events.Kind(typ)) }
	anyOf := func(ts []string) bool { return slices.ContainsFunc(ts, has) }
	chain := c.Saga()
	if len(chain) == 0 {
		return StatusPending, nil
	}
	if has(chain[len(chain)-1].Done()) {
		return StatusConfirmed, nil
	}
	failed := false
	for _, s := range chain {
		failed = failed || anyOf(s.Publishes[1:]) || has(stuck(s))
	}
	if !failed {
		return StatusPending, nil
	}
	later := false // an event of a later step was seen
	undoing := false
	for _, s := range slices.Backward(chain) {
		happened := has(s.Done()) || has(stuck(s)) || later
		// The pivot has no compensation, but its undo by key at the
		// deadline can be stuck too (events.Step.Stuck): open until its
		// failed event.
		if (s.Compensation != nil || s.Stuck != "") && happened && !anyOf(ended(s)) {
			if has(stuck(s)) {
				open = append(open, s.Name)
			} else {
				undoing = true
			}
		}
		later = later || anyOf(append(slices.Clone(s.Publishes), s.UndoEvents()...))
	}
	if undoing || len(open) > 0 {
		return StatusCanceling, open
	}
	return StatusCanceled, nil
}

// stuck is the event type step s publishes when its undo raised its
// incident, or "".
func stuck(s events.Step) string { return s.StuckType() }

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
// failed, rejected, stuck and done events seen ("canceled", "failed",
// "rejected", "cancel_stuck", "bought"), else pick's answer for nothing
// seen.
func addSteps(m map[string]string, c events.Catalogue, pick func(order ...string) string) {
	for _, s := range c.Saga() {
		if _, ok := m[s.Name]; ok {
			continue
		}
		var order []string
		// A stuck undo ranks below every ending and above done.
		evs := append(slices.Clone(s.Publishes[:1]), stuck(s))
		evs = append(append(evs, s.Publishes[1:]...), compensated(s)...)
		for _, typ := range slices.Backward(slices.DeleteFunc(evs, func(t string) bool { return t == "" })) {
			kind := events.Kind(typ)
			_, verb, _ := strings.Cut(kind, ".")
			order = append(order, kind, verb)
		}
		m[s.Name] = pick(order...)
	}
}
