package saga_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/services/hotel"
	"github.com/tripsaga/tripsaga/sim"
)

// stuckRunner is the hotel's runner with its stuck event, as NewService
// gives it from the catalogue (hotel.release_stuck).
func stuckRunner(t *testing.T, b *bundle, timing saga.Timing) *saga.Runner {
	spec := hotel.Spec(b.hotelURL)
	spec.OnStuck = events.HotelReleaseStuck
	r, err := saga.New(saga.Config{Pool: b.pool, Spec: spec, Timing: timing})
	require.NoError(t, err)
	return r
}

// settle carries out an operator's settle of the hotel step of tripID
// with outcome and returns the effect the operator log recorded.
func settle(t *testing.T, b *bundle, r *saga.Runner, tripID, outcome string) string {
	t.Helper()
	ctx := context.Background()
	d := events.OperatorActionData{Action: events.ActionSettle, TripID: tripID, Service: "hotel", Outcome: outcome,
		Reason: "released by phone, ticket 42", Operator: "ada", IdempotencyKey: "settle-" + outcome + "-" + time.Now().String()}
	e, err := events.New(events.Source("reconciler"), events.OperatorAction, tripID, d)
	require.NoError(t, err)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, r.Operate(ctx, tx, e, d))
	require.NoError(t, tx.Commit(ctx))
	log, err := saga.OperatorLog(ctx, b.pool, tripID)
	require.NoError(t, err)
	for _, l := range log {
		if l.EventID == e.ID() {
			require.Equal(t, events.ActionSettle, l.Action)
			return l.Effect
		}
	}
	t.Fatalf("settle of %s not in the operator log", tripID)
	return ""
}

// outboxData returns the data of the trip's outbox events of typ.
func outboxData(t *testing.T, b *bundle, tripID, typ string) []events.StepData {
	rows, err := b.pool.Query(context.Background(), "SELECT data FROM outbox WHERE headers->>'ce-subject' = $1 AND headers->>'ce-type' = $2 ORDER BY id", tripID, typ)
	require.NoError(t, err)
	var out []events.StepData
	for rows.Next() {
		var raw []byte
		require.NoError(t, rows.Scan(&raw))
		var d events.StepData
		require.NoError(t, json.Unmarshal(raw, &d))
		out = append(out, d)
	}
	return out
}

func TestAStuckUndoLetsTheUnwindGoOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ARefusedUndoPublishesItsStuckEventOnceAndGoesOnRetrying", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpRelease, Fault: sim.FaultRefuse, Reason: "property closed"}))
		timing := fast
		timing.UndoBackoffMax = 50 * time.Millisecond // a refusal waits the longest backoff: short here, so it is retried often
		r := stuckRunner(t, b, timing)
		request(t, b, r, "T-refstuck", "refstuck@x.io")
		runUntil(t, r, func() bool { return step(t, b, "T-refstuck").Status == "done" }, "held")
		undo(t, b, r, "T-refstuck")
		runUntil(t, r, func() bool { return step(t, b, "T-refstuck").UndoAttempts >= 4 }, "the refused undo is retried")
		require.Equal(t, []string{events.HotelHeld, events.HotelReleaseStuck}, outboxTypes(t, b, "T-refstuck"),
			"the stuck event once, at the incident, however many retries follow")
		require.Equal(t, "compensating", step(t, b, "T-refstuck").Status, "the undo is still owed")
		require.Equal(t, "held", companyStatus(t, b, "T-refstuck:hotel"))
		inc := incidents(t, b)
		require.Len(t, inc, 1)
		require.Equal(t, saga.IncidentCompensationRefused, inc[0].Kind)
	})

	t.Run("AnUndoFailingPastTheIncidentLimitPublishesItsStuckEventAndIsUndoneLater", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpRelease, Fault: sim.FaultFail}))
		r := stuckRunner(t, b, fast)
		request(t, b, r, "T-failstuck", "failstuck@x.io")
		runUntil(t, r, func() bool { return step(t, b, "T-failstuck").Status == "done" }, "held")
		undo(t, b, r, "T-failstuck")
		runUntil(t, r, func() bool { return len(outboxTypes(t, b, "T-failstuck")) == 2 }, "the stuck event at the incident")
		require.Equal(t, []string{events.HotelHeld, events.HotelReleaseStuck}, outboxTypes(t, b, "T-failstuck"))
		s := step(t, b, "T-failstuck")
		require.Equal(t, "compensating", s.Status)
		require.GreaterOrEqual(t, s.UndoAttempts, fast.IncidentAfter, "raised at the limit, not before")
		require.Equal(t, saga.IncidentCompensationStuck, incidents(t, b)[0].Kind)

		require.NoError(t, sim.ClearFaults(ctx, b.hotelURL))
		runUntil(t, r, func() bool { return step(t, b, "T-failstuck").Status == "compensated" }, "undone once the company answers")
		require.Equal(t, []string{events.HotelHeld, events.HotelReleaseStuck, events.HotelReleased}, outboxTypes(t, b, "T-failstuck"),
			"the undo's own event closes the open undo")
		require.Empty(t, outboxData(t, b, "T-failstuck", events.HotelReleased)[0].SettledBy, "the company answered, no person")
		require.NotNil(t, incidents(t, b)[0].ResolvedAt)
	})

	t.Run("SettleOfAStuckUndoStopsItsRetriesAndPublishesItsEventOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpRelease, Fault: sim.FaultRefuse, Reason: "property closed"}))
		slow := fast
		slow.UndoBackoffMax = time.Hour
		r := stuckRunner(t, b, slow)
		request(t, b, r, "T-settle", "settle@x.io")
		runUntil(t, r, func() bool { return step(t, b, "T-settle").Status == "done" }, "held")

		require.Contains(t, settle(t, b, r, "T-settle", events.SettleUndone), "refused: step hotel is done: nothing stuck to settle")
		undo(t, b, r, "T-settle")
		require.Contains(t, settle(t, b, r, "T-settle", events.SettleUndone), "its undo has raised no incident: it is not stuck",
			"an undo still being retried before its limit is not stuck")
		runUntil(t, r, func() bool { return len(incidents(t, b)) == 1 }, "the refusal raises its incident")
		require.Contains(t, settle(t, b, r, "T-settle", events.SettleDone), "what is stuck is its undo; settle it undone")
		require.Contains(t, settle(t, b, r, "T-settle", "maybe"), `refused: outcome "maybe" is not one of undone, done, not_done`)

		effect := settle(t, b, r, "T-settle", events.SettleUndone)
		require.Contains(t, effect, "settled by hand (undone): step hotel is compensated, its retries stopped, 1 incident(s) resolved; hotel.released published")
		s := step(t, b, "T-settle")
		require.Equal(t, "compensated", s.Status)
		require.Contains(t, s.Outcome, "settled by hand: undone by ada (released by phone, ticket 42)")
		require.Equal(t, []string{events.HotelHeld, events.HotelReleaseStuck, events.HotelReleased}, outboxTypes(t, b, "T-settle"))
		require.Equal(t, "ada", outboxData(t, b, "T-settle", events.HotelReleased)[0].SettledBy, "the event says a person did it")
		inc := incidents(t, b)
		require.NotNil(t, inc[0].ResolvedAt)
		require.Equal(t, "ada", inc[0].ResolvedBy)
		require.Equal(t, "released by phone, ticket 42", inc[0].Resolution)

		// Never twice: the second settle is refused and publishes nothing.
		require.Contains(t, settle(t, b, r, "T-settle", events.SettleUndone), "a step is settled once")
		makeDue(t, b, "T-settle")
		recoverPass(t, r)
		require.Equal(t, 0, step(t, b, "T-settle").UndoAttempts-s.UndoAttempts, "no retry after the settle")
		require.Len(t, outboxTypes(t, b, "T-settle"), 3)
	})

	t.Run("SettleOfAForwardStepStuckUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultUnauthorized, Reason: "token expired"}))
		patientTiming := fast
		patientTiming.StepDeadline = time.Hour // unknown, asked again, not undone at a deadline during the test
		r := stuckRunner(t, b, patientTiming)
		request(t, b, r, "T-fwd", "fwd@x.io")
		runUntil(t, r, func() bool { return hasIncident(t, b, saga.IncidentCompanyCredentials) }, "401 raises company_credentials")
		require.Contains(t, settle(t, b, r, "T-fwd", events.SettleUndone), "no undo of it was asked for; settle it done or not_done")
		effect := settle(t, b, r, "T-fwd", events.SettleNotDone)
		require.Contains(t, effect, "step hotel is failed")
		require.Contains(t, effect, "hotel.failed published")
		require.Equal(t, "failed", step(t, b, "T-fwd").Status)
		require.Equal(t, []string{events.HotelFailed}, outboxTypes(t, b, "T-fwd"), "the steps before it are undone on its failed event")
		require.Equal(t, "ada", outboxData(t, b, "T-fwd", events.HotelFailed)[0].SettledBy)
		require.Contains(t, settle(t, b, r, "T-fwd", events.SettleDone), "a step is settled once")
	})
}
