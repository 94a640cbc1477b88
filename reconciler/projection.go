package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/reconciler/internal/dbsqlc"
	"github.com/tripsaga/tripsaga/services/trips"
)

// ProjectionName is the name of the reconciler's projection in
// [events.Default]: its durable consumers and its inbox rows use it.
const ProjectionName = "reconciler"

var queries = dbsqlc.New() //nolint:gochecknoglobals // stateless query set

// projectionTypes returns the event types the reconciler consumes in any
// trip version (events.ProjectionAnyVersion): a trip keeps the steps it
// started with.
func projectionTypes() []string {
	p, _ := events.ProjectionAnyVersion(ProjectionName)
	return p.Consumes
}

// Status derives the status of a trip in catalogue c's order from the
// event kinds seen, in any order.
// A trip.confirmed or trip.canceled event settles the trip (settled is
// "confirmed" or "canceled", confirmed winning if both were ever seen);
// until then the status is [trips.Project] of the step events, the rule the
// trips service itself follows, and settled is "".
//
// A traveler's cancellation follows a confirmed trip: trip.canceled_by_traveler
// settles it as "canceled_by_traveler"; after trip.cancellation_requested
// and until then it is "canceling_by_traveler", not settled (so a
// cancellation that never ends is found stuck).
func Status(c events.Catalogue, seen []string) (status, settled string) {
	return StatusOf(c.Version(), seen)
}

// StatusOf is [Status] for a trip of version (events.VersionExtension; ""
// the default order): its status follows the steps it started with
// ([trips.ProjectOf]), whatever STEPS the reconciler runs.
func StatusOf(version string, seen []string) (status, settled string) {
	switch {
	case slices.Contains(seen, events.Kind(events.TripCanceledByTraveler)):
		return trips.StatusCanceledByTraveler, trips.StatusCanceledByTraveler
	case slices.Contains(seen, events.Kind(events.TripCancellationRequested)):
		return trips.StatusCancelingByTraveler, ""
	case slices.Contains(seen, "trip.confirmed"):
		return trips.StatusConfirmed, trips.StatusConfirmed
	case slices.Contains(seen, "trip.canceled"):
		return trips.StatusCanceled, trips.StatusCanceled
	}
	return trips.ProjectOf(version, seen), ""
}

// apply adds one event to trip_view inside tx. It is correct in any
// arrival order (seen is a set, times are min/max) but not idempotent by
// itself: the caller's inbox row makes each event count once.
//
// Errors wrapping [events.ErrInvalidEvent] mean the event can never be
// applied (no usable trip id or type).
func apply(ctx context.Context, tx pgx.Tx, e event.Event) error {
	if err := applicable(e); err != nil {
		return err
	}
	kind, trip := events.Kind(e.Type()), e.Subject()
	at := e.Time().UTC()
	if e.Time().IsZero() {
		// CloudEvents time is optional; our producers always set it. A
		// replay of such an event gets another time.
		at = time.Now().UTC()
	}
	version := events.VersionOf(e)
	status, settled := StatusOf(version, []string{kind})
	row, err := queries.TripViewApply(ctx, tx, dbsqlc.TripViewApplyParams{
		TripID: trip, Kind: kind, NewStatus: status, NewSettled: nonEmpty(settled), At: at, Version: version,
	})
	if err != nil {
		return fmt.Errorf("trip_view %s: %w", trip, err)
	}
	if err := recordRefund(ctx, tx, e); err != nil {
		return err
	}
	status, settled = StatusOf(row.Version, row.Seen)
	if status == row.Status && settled == deref(row.Settled) {
		return nil
	}
	if err := queries.TripViewSetStatus(ctx, tx, dbsqlc.TripViewSetStatusParams{
		TripID: trip, Status: status, Settled: nonEmpty(settled),
	}); err != nil {
		return fmt.Errorf("trip_view %s status: %w", trip, err)
	}
	return nil
}

// applicable returns an error wrapping [events.ErrUnknownType] or
// [events.ErrInvalidEvent] if e has no kind, no usable trip id (its
// CloudEvents subject) or data that is not JSON (RFC 8259).
func applicable(e event.Event) error {
	if events.Kind(e.Type()) == "" {
		return fmt.Errorf("%w: %q", events.ErrUnknownType, e.Type())
	}
	if err := events.ValidateTripID(e.Subject()); err != nil {
		return fmt.Errorf("event %s: %w", e.ID(), err)
	}
	// The view keeps no data, but an event whose data is not JSON is
	// not what its publisher meant to say: it is parked, not projected.
	if !json.Valid(e.Data()) {
		return fmt.Errorf("%w: event %s: data of %s is not valid JSON", events.ErrInvalidEvent, e.ID(), e.Type())
	}
	return nil
}

// recordRefund records, for a trip.cancellation_requested, what the
// traveler's cancellation refunds (trip_view.refund_cents), once the trip's
// row exists; other events change nothing. Data that cannot be decoded is
// an error wrapping events.ErrInvalidEvent.
func recordRefund(ctx context.Context, tx pgx.Tx, e event.Event) error {
	if e.Type() != events.TripCancellationRequested {
		return nil
	}
	var d events.CancellationData
	if err := events.DecodeData(e, &d); err != nil {
		return err
	}
	if err := queries.TripViewSetRefund(ctx, tx, dbsqlc.TripViewSetRefundParams{TripID: e.Subject(), RefundCents: d.RefundCents}); err != nil {
		return fmt.Errorf("trip_view %s refund: %w", e.Subject(), err)
	}
	return nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
