package saga_test

import (
	"context"
	"testing"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/sagatest"
	"github.com/tripsaga/tripsaga/services/hotel"
	"github.com/tripsaga/tripsaga/services/insurance"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

const (
	plain   = "hotel,payment,car"           // the default order: no insurance
	insured = "hotel,insurance,payment,car" // insurance between hotel and payment
)

// versioned returns an event of typ about trip stamped with version ("":
// none, an event of before versions).
func versioned(t *testing.T, source, typ, trip, version string, data any) cloudevent.Event {
	t.Helper()
	e, err := events.New(events.Source(source), typ, trip, data)
	require.NoError(t, err)
	events.SetVersion(&e, version)
	return e
}

// runService starts svc until the test ends.
func runService(t *testing.T, svc *saga.Service) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = svc.Run(ctx, nil); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// outboxVersions returns the ce-tripsteps header of each of the trip's
// outbox events ("" when it has none), in order.
func outboxVersions(t *testing.T, b *bundle, tripID string) []string {
	rows, err := b.pool.Query(context.Background(), "SELECT coalesce(headers->>'ce-"+events.VersionExtension+"', '') FROM outbox WHERE headers->>'ce-subject' = $1 ORDER BY id", tripID)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	return out
}

// inboxCount returns how many of the events are recorded in the inbox of
// consumer (the database of b).
func inboxCount(t *testing.T, b *bundle, consumer string, es ...cloudevent.Event) int {
	n := 0
	for _, e := range es {
		var c int
		require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM inbox WHERE consumer = $1 AND event_id = $2", consumer, e.ID()).Scan(&c))
		n += c
	}
	return n
}

// TestATripKeepsItsVersion: a step service reacts to a trip's events by
// the catalogue of the trip's version (its saga order, carried as the
// ce-tripsteps extension), not by its own STEPS, and carries the version
// on in every event it publishes about the trip.
func TestATripKeepsItsVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TheHotelUndoesEachTripOnItsOwnVersionsTriggers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, _, js := testenv.JetStream(t)
		require.NoError(t, events.EnsureStreams(ctx, js, events.Full()))
		// The hotel runs the default STEPS (no insurance) and still
		// serves trips of the version with insurance, and the other way.
		svc, err := saga.NewService(saga.ServiceConfig{
			Pool: b.pool, JetStream: js, Catalogue: events.Default, Family: events.TripVersions(), Spec: hotel.Spec(b.hotelURL), Build: saga.Builder(hotel.Build), Timing: fast,
		})
		require.NoError(t, err)
		runService(t, svc)

		for _, c := range []struct{ trip, version string }{{"T-vplain", plain}, {"T-vinsured", insured}, {"T-vnone", ""}} {
			tr := trip(c.trip + "@x.io")
			publishMsg(t, js, versioned(t, "trips", events.TripRequested, c.trip, c.version, events.TripRequestedData{TripID: c.trip, Request: tr}), "", nil)
		}
		for _, trip := range []string{"T-vplain", "T-vinsured", "T-vnone"} {
			testenv.Eventually(t, func() bool {
				s, err := saga.Steps(ctx, b.pool, trip)
				return err == nil && len(s) == 1 && s[0].Status == "done"
			}, trip+" held")
		}
		require.Equal(t, []string{plain}, outboxVersions(t, b, "T-vplain"), "hotel.held carries the trip's version")
		require.Equal(t, []string{insured}, outboxVersions(t, b, "T-vinsured"))
		require.Equal(t, []string{""}, outboxVersions(t, b, "T-vnone"), "a trip of before versions stays without one")

		// In the insured version the hotel is undone on the insurer's
		// endings, not the card processor's: a payment.declined of it is
		// recorded and ignored (payment's endings undo the insurance
		// there), an insurance.rejected releases the room.
		declined := versioned(t, "payment", events.PaymentDeclined, "T-vinsured", insured, events.StepData{TripID: "T-vinsured", Step: "payment", IdempotencyKey: "T-vinsured:charge"})
		rejected := versioned(t, "insurance", events.InsuranceRejected, "T-vplain", plain, events.StepData{TripID: "T-vplain", Step: "insurance", IdempotencyKey: "T-vplain:insurance"})
		publishMsg(t, js, declined, "", nil)
		publishMsg(t, js, rejected, "", nil)
		testenv.Eventually(t, func() bool { return inboxCount(t, b, "hotel", declined, rejected) == 2 }, "both recorded in the inbox")
		require.Equal(t, "done", step(t, b, "T-vinsured").Status, "not undone on an event that is no trigger of its version")
		require.Equal(t, "done", step(t, b, "T-vplain").Status, "a trip without insurance is not undone on an insurer's event")

		publishMsg(t, js, versioned(t, "insurance", events.InsuranceRejected, "T-vinsured", insured, events.StepData{TripID: "T-vinsured", Step: "insurance", IdempotencyKey: "T-vinsured:insurance"}), "", nil)
		publishMsg(t, js, versioned(t, "payment", events.PaymentDeclined, "T-vplain", plain, events.StepData{TripID: "T-vplain", Step: "payment", IdempotencyKey: "T-vplain:charge"}), "", nil)
		for _, trip := range []string{"T-vinsured", "T-vplain"} {
			testenv.Eventually(t, func() bool { return step(t, b, trip).Status == "compensated" }, trip+" released on its own version's trigger")
			require.Equal(t, "released", companyStatus(t, b, trip+":hotel"))
		}
		require.Equal(t, []string{insured, insured}, outboxVersions(t, b, "T-vinsured"), "hotel.released carries the version too")
		require.Equal(t, []string{events.HotelHeld, events.HotelReleased}, outboxTypes(t, b, "T-vinsured"))

		// An undo before its step (the dtm barrier) says so in the trip's version.
		publishMsg(t, js, versioned(t, "insurance", events.InsuranceFailed, "T-vearly", insured, events.StepData{TripID: "T-vearly", Step: "insurance", IdempotencyKey: "T-vearly:insurance"}), "", nil)
		testenv.Eventually(t, func() bool { return len(outboxTypes(t, b, "T-vearly")) == 1 }, "voided, with its event")
		require.Equal(t, []string{insured}, outboxVersions(t, b, "T-vearly"))
	})

	t.Run("AStepNewToTheSystemLeavesTheTripsOfVersionsWithoutItAlone", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ipool, _ := testenv.SchemaPool(t, "insurance", tripsql.SetSaga)
		ib := &bundle{pool: ipool}
		_, _, js := testenv.JetStream(t)
		require.NoError(t, events.EnsureStreams(ctx, js, events.Full()))
		// History from before the insurer existed: hotel.held of trips
		// of the default order, stamped and not.
		held := func(id, version string) cloudevent.Event {
			tr := trip(id + "@x.io")
			e := versioned(t, "hotel", events.HotelHeld, id, version, events.StepData{TripID: id, Step: "hotel", IdempotencyKey: id + ":hotel", Request: sagatest.JSON(t, tr)})
			publishMsg(t, js, e, "", nil)
			return e
		}
		old := []cloudevent.Event{held("T-old1", plain), held("T-old2", "")}
		insurerURL := b.hotelURL[:len(b.hotelURL)-len("/hotel")] + "/insurer"
		spec, err := insurance.Spec(events.Full(), insurerURL)
		require.NoError(t, err)
		svc, err := saga.NewService(saga.ServiceConfig{
			Pool: ipool, JetStream: js, Catalogue: events.Full(), Family: events.TripVersions(), Spec: spec, Build: saga.Builder(insurance.Build), Timing: fast,
		})
		require.NoError(t, err)
		runService(t, svc)
		newer := held("T-new", insured)
		testenv.Eventually(t, func() bool {
			s, err := saga.Steps(ctx, ipool, "T-new")
			return err == nil && len(s) == 1 && s[0].Status == "done"
		}, "the trip of a version with insurance is insured")
		testenv.Eventually(t, func() bool { return inboxCount(t, ib, "insurance", append(old, newer)...) == 3 }, "every event recorded")
		for _, trip := range []string{"T-old1", "T-old2"} {
			s, err := saga.Steps(ctx, ipool, trip)
			require.NoError(t, err)
			require.Empty(t, s, "%s: a trip of a version without insurance is never insured", trip)
		}
		require.Equal(t, []string{insured}, outboxVersions(t, ib, "T-new"), "insurance.bought carries the version")
	})

	t.Run("AnInvalidVersionIsParkedNotRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, _, js := testenv.JetStream(t)
		require.NoError(t, events.EnsureStreams(ctx, js, events.Full()))
		svc, err := saga.NewService(saga.ServiceConfig{
			Pool: b.pool, JetStream: js, Catalogue: events.Default, Family: events.TripVersions(), Spec: hotel.Spec(b.hotelURL), Build: saga.Builder(hotel.Build), Timing: fast,
		})
		require.NoError(t, err)
		runService(t, svc)
		tr := trip("bad@x.io")
		publishMsg(t, js, versioned(t, "trips", events.TripRequested, "T-vbad", "car,hotel", events.TripRequestedData{TripID: "T-vbad", Request: tr}), "", nil)
		dl, err := js.Stream(ctx, events.StreamDeadLetter)
		require.NoError(t, err)
		testenv.Eventually(t, func() bool {
			info, err := dl.Info(ctx)
			return err == nil && info.State.Msgs == 1
		}, "parked on DEADLETTER")
		m, err := dl.GetLastMsgForSubject(ctx, ">")
		require.NoError(t, err)
		require.Contains(t, m.Header.Get(inbox.HeaderDeadReason), "trip version", "the reason names the version")
		s, err := saga.Steps(ctx, b.pool, "T-vbad")
		require.NoError(t, err)
		require.Empty(t, s, "nothing is called for it")
	})
}
