package trips

import (
	"slices"

	"github.com/tripsaga/tripsaga/events"
)

// Trip statuses (trips-api.md, Statuses).
const (
	StatusPending   = "pending"
	StatusConfirmed = "confirmed"
	StatusCanceling = "canceling"
	StatusCanceled  = "canceled"
)

// IsFinal reports whether the booking of a trip in status is settled:
// confirmed or canceled, or canceling_by_traveler or canceled_by_traveler
// (a traveler cancels only a confirmed trip).
func IsFinal(status string) bool {
	return status == StatusConfirmed || status == StatusCanceled || status == StatusCancelingByTraveler || status == StatusCanceledByTraveler
}

// failures maps each failure kind to the reason shown to the traveler when
// the event carries none.
var failures = map[string]string{ //nolint:gochecknoglobals // read-only table
	"hotel.rejected":   "hotel sold out",
	"hotel.failed":     "the hotel hold could not be confirmed in time",
	"payment.declined": "card declined",
	"payment.failed":   "the charge could not be confirmed in time",
	"car.rejected":     "car sold out",
	"car.failed":       "the car booking could not be confirmed in time",
	// The optional insurance step (STEPS naming insurance).
	"insurance.rejected": "the insurer refused to insure the trip",
	"insurance.failed":   "the insurance policy could not be confirmed in time",
}

// Project derives a trip's status from the set of event kinds seen
// ("hotel.held", "payment.refunded", ...), whatever order they came in:
//
//   - confirmed once the pivot (the car; the payment in the charge-last
//     order) is done;
//   - pending while no step failed;
//   - canceled once a step failed and every step that happened is undone
//     (a step happened if its done event, or any event of a later step, was
//     seen: the later step ran only because it was done);
//   - canceling otherwise, also while an undo that raised its incident is
//     still open ([OpenUndos]): the others are undone meanwhile.
func Project(c events.Catalogue, seen []string) string {
	status, _ := project(c, seen)
	return status
}

// catalogueOf returns the catalogue of a trip of version (its saga order,
// events.VersionExtension; "" the default order): a trip is projected by
// the steps it started with, not by this process's STEPS. A version the
// service cannot build (it wrote it itself, so only a row edited by hand)
// falls back to the default order (events.Default).
func catalogueOf(version string) events.Catalogue {
	c, err := events.CatalogueOf(version)
	if err != nil {
		return events.Default
	}
	return c
}

// ProjectOf is [Project] for a trip of version (events.VersionExtension).
func ProjectOf(version string, seen []string) string {
	status, _ := project(catalogueOf(version), seen)
	return status
}

// OpenUndosOf is [OpenUndos] for a trip of version.
func OpenUndosOf(version string, seen []string) []string {
	_, open := project(catalogueOf(version), seen)
	return open
}

// OpenUndos returns, for a trip whose events seen are seen, the steps
// whose undo raised its incident (stuck past its limit, or refused for
// good: its stuck event, e.g. payment.refund_stuck, was seen) and is not
// done yet, newest first: the trip stays canceling while the steps before
// them are undone, and settles canceled when they are done (by the
// company, or settled by an operator). Nil when there is none.
func OpenUndos(c events.Catalogue, seen []string) []string {
	_, open := project(c, seen)
	return open
}

// FailureReason returns the traveler-facing reason of a failure kind, or "".
func FailureReason(kind string) string { return failures[kind] }

// Steps returns each step's state for GET /trips/{id}: "held",
// "released", "sold_out", "charged", "refund_stuck" (its undo raised its
// incident and goes on), ..., "pending" while nothing is known,
// "skipped" when the trip ended before the step ran.
func Steps(c events.Catalogue, seen []string, status string) map[string]string {
	return StepsOf(c.Version(), seen, status)
}

// StepsOf is [Steps] for a trip of version (events.VersionExtension): an
// optional step ("insurance") is listed only for a trip that has it.
func StepsOf(version string, seen []string, status string) map[string]string {
	has := func(k string) bool { return slices.Contains(seen, k) }
	pick := func(order ...string) string {
		for i := 0; i+1 < len(order); i += 2 {
			if has(order[i]) {
				return order[i+1]
			}
		}
		if status == StatusPending {
			return "pending"
		}
		return "skipped"
	}
	m := map[string]string{
		"hotel":   pick("hotel.released", "released", "hotel.failed", "failed", "hotel.rejected", "sold_out", "hotel.release_stuck", "release_stuck", "hotel.held", "held"),
		"payment": pick("payment.refunded", "refunded", "payment.failed", "failed", "payment.declined", "declined", "payment.refund_stuck", "refund_stuck", "payment.charged", "charged"),
		// car.canceled: its compensation, in an order where the car comes
		// before the pivot (charge-last).
		"car": pick("car.canceled", "canceled", "car.booked", "booked", "car.failed", "failed", "car.rejected", "sold_out", "car.cancel_stuck", "cancel_stuck"),
	}
	addSteps(m, catalogueOf(version), pick) // an optional step's: "insurance"
	return m
}
