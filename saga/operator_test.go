package saga_test

import (
	"context"
	"testing"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/services/hotel"
	"github.com/tripsaga/tripsaga/sim"
)

// operate carries out an operator's action about tripID with r, in its own
// transaction, as the service's operator inbox does, and returns the
// effect the operator log recorded.
func operate(t *testing.T, b *bundle, r *saga.Runner, tripID, action, reason string) string {
	t.Helper()
	ctx := context.Background()
	d := events.OperatorActionData{Action: action, TripID: tripID, Service: "hotel", Reason: reason, Operator: "ada", IdempotencyKey: action + "-" + tripID}
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
			require.Equal(t, action, l.Action)
			require.Equal(t, "ada", l.Operator)
			require.Equal(t, reason, l.Reason)
			return l.Effect
		}
	}
	t.Fatalf("action %s of %s not in the operator log", action, tripID)
	return ""
}

// makeDue makes the trip's unfinished rows due now, as time passing would.
func makeDue(t *testing.T, b *bundle, tripID string) {
	_, err := b.pool.Exec(context.Background(), "UPDATE steps SET next_attempt_at = now() WHERE trip_id = $1", tripID)
	require.NoError(t, err)
}

func TestOperatorActions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A refused undo waits for the longest backoff (an hour here) and
	// raises an incident at once: only an operator moves it sooner.
	slow := fast
	slow.UndoBackoffMax = time.Hour

	t.Run("PauseHoldsEveryCallUntilResume", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := runner(t, b, slow)
		request(t, b, r, "T-pause", "pause@x.io")
		runUntil(t, r, func() bool { return step(t, b, "T-pause").Status == "done" }, "held")
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpRelease, Fault: sim.FaultFail}))
		undo(t, b, r, "T-pause")
		runUntil(t, r, func() bool { return step(t, b, "T-pause").UndoAttempts >= 1 }, "an undo tried")

		require.Equal(t, "paused: no company call for the trip until resumed", operate(t, b, r, "T-pause", events.ActionPause, "card processor outage"))
		require.Equal(t, "already paused", operate(t, b, r, "T-pause", events.ActionPause, "again"))
		paused, by, why, err := saga.Paused(ctx, b.pool, "T-pause")
		require.NoError(t, err)
		require.True(t, paused)
		require.Equal(t, "ada", by)
		require.Equal(t, "card processor outage", why)
		attempts := step(t, b, "T-pause").UndoAttempts
		makeDue(t, b, "T-pause")
		n, err := r.RecoveryPass(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "the recovery pass claims nothing of a paused trip")
		require.Equal(t, attempts, step(t, b, "T-pause").UndoAttempts, "no undo call while paused")

		require.NoError(t, sim.ClearFaults(ctx, b.hotelURL))
		require.Equal(t, "1 unfinished step(s) due now; pause lifted", operate(t, b, r, "T-pause", events.ActionResume, "outage over"))
		runUntil(t, r, func() bool { return step(t, b, "T-pause").Status == "compensated" }, "undone once resumed")
		require.Equal(t, "released", companyStatus(t, b, "T-pause:hotel"))
		paused, _, _, err = saga.Paused(ctx, b.pool, "T-pause")
		require.NoError(t, err)
		require.False(t, paused)
	})

	t.Run("RetryNowThenResolve", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := runner(t, b, slow)
		for _, trip := range []string{"T-retry", "T-resolve"} {
			request(t, b, r, trip, trip+"@x.io")
			runUntil(t, r, func() bool { return step(t, b, trip).Status == "done" }, "held")
		}
		rule, err := sim.AddFaultRule(ctx, b.hotelURL, sim.Rule{Op: sim.OpRelease, Fault: sim.FaultRefuse, Reason: "property closed"})
		require.NoError(t, err)
		undo(t, b, r, "T-retry")
		undo(t, b, r, "T-resolve")
		runUntil(t, r, func() bool {
			inc, err := saga.Incidents(ctx, b.pool)
			require.NoError(t, err)
			return len(inc) == 2
		}, "both refusals raise an incident")
		require.Equal(t, 1, step(t, b, "T-retry").UndoAttempts)

		_, err = sim.RemoveFault(ctx, b.hotelURL, rule.ID)
		require.NoError(t, err)
		require.Equal(t, "1 unfinished step(s) due now", operate(t, b, r, "T-retry", events.ActionRetryUndo, "property reopened"))
		// Without the operator the next attempt would come in an hour.
		runUntil(t, r, func() bool { return step(t, b, "T-retry").Status == "compensated" }, "undone at once")
		require.Equal(t, 2, step(t, b, "T-retry").UndoAttempts)

		require.Equal(t, "1 open incident(s) resolved", operate(t, b, r, "T-resolve", events.ActionResolve, "released by phone with the hotel"))
		inc, err := saga.Incidents(ctx, b.pool)
		require.NoError(t, err)
		for _, i := range inc {
			require.NotNil(t, i.ResolvedAt, i.TripID)
			if i.TripID == "T-resolve" {
				require.Equal(t, "ada", i.ResolvedBy)
				require.Equal(t, "released by phone with the hotel", i.Resolution)
			} else {
				require.Empty(t, i.ResolvedBy, "resolved by the undo, not by a person")
			}
		}
		require.Equal(t, "compensating", step(t, b, "T-resolve").Status, "retries go on after a resolve")
	})

	t.Run("UndoLeakUndoesByKeyAndPublishesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := runner(t, b, fast)
		// An orphan: a hold the service never recorded.
		tr := trip("orphan@x.io")
		body, err := hotel.Build("T-orphan", tr)
		require.NoError(t, err)
		_, err = b.company.Create(ctx, "T-orphan:hotel", body)
		require.NoError(t, err)
		require.Equal(t, "held", companyStatus(t, b, "T-orphan:hotel"))

		require.Equal(t, "no step here: undoing T-orphan:hotel by key", operate(t, b, r, "T-orphan", events.ActionUndoLeak, "orphan found by the sweep"))
		recoverPass(t, r)
		require.Equal(t, "released", companyStatus(t, b, "T-orphan:hotel"))
		s := step(t, b, "T-orphan")
		require.Equal(t, "compensated", s.Status)
		require.Equal(t, saga.CauseOperator, s.UndoCause)
		require.Empty(t, outboxTypes(t, b, "T-orphan"), "no event: the action is the record")

		// A step that is done is its trip's: refused, nothing changes.
		request(t, b, r, "T-whole", "whole@x.io")
		runUntil(t, r, func() bool { return step(t, b, "T-whole").Status == "done" }, "held")
		require.Equal(t, "refused: step is done; its own saga owns the record", operate(t, b, r, "T-whole", events.ActionUndoLeak, "mistake"))
		require.Equal(t, "done", step(t, b, "T-whole").Status)
		require.Equal(t, "held", companyStatus(t, b, "T-whole:hotel"))
	})
}

// publishMsg stores e on subject (its own when "") with extra headers.
func publishMsg(t *testing.T, js jetstream.JetStream, e cloudevent.Event, subject string, extra map[string]string) uint64 {
	t.Helper()
	h, err := events.EncodeHeaders(e)
	require.NoError(t, err)
	if subject == "" {
		subject, err = events.Subject(e.Type(), e.Subject())
		require.NoError(t, err)
	}
	m := &nats.Msg{Subject: subject, Data: e.Data(), Header: nats.Header{}}
	for k, v := range h {
		m.Header.Set(k, v)
	}
	for k, v := range extra {
		m.Header.Set(k, v)
	}
	ack, err := js.PublishMsg(context.Background(), m)
	require.NoError(t, err)
	return ack.Sequence
}

func TestServiceCarriesOutTheActionsNamingIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, _, js := testenv.JetStream(t)
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	svc, err := saga.NewService(saga.ServiceConfig{
		Pool: b.pool, JetStream: js, Catalogue: events.Default, Family: events.TripVersions(), Spec: hotel.Spec(b.hotelURL), Build: saga.Builder(hotel.Build), Timing: fast,
	})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = svc.Run(rctx, nil); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	action := func(d events.OperatorActionData) cloudevent.Event {
		e, err := events.New(events.Source("reconciler"), events.OperatorAction, d.TripID, d)
		require.NoError(t, err)
		publishMsg(t, js, e, "", nil)
		return e
	}
	// Another service's action is not carried out here; this one's is.
	other := action(events.OperatorActionData{Action: events.ActionPause, TripID: "T-svc", Service: "payment", Reason: "r", Operator: "ada", IdempotencyKey: "k1"})
	mine := action(events.OperatorActionData{Action: events.ActionPause, TripID: "T-svc", Service: "hotel", Reason: "r", Operator: "ada", IdempotencyKey: "k2"})
	testenv.Eventually(t, func() bool { p, _, _, err := saga.Paused(ctx, b.pool, "T-svc"); return err == nil && p }, "paused by the action")
	log, err := saga.OperatorLog(ctx, b.pool, "T-svc")
	require.NoError(t, err)
	require.Len(t, log, 1)
	require.Equal(t, mine.ID(), log[0].EventID)
	require.NotEqual(t, other.ID(), log[0].EventID)

	// A trip.requested the hotel consumer parked, re-driven into it: the
	// step is recorded and run.
	tr := trip("redrive@x.io")
	req, err := events.New(events.Source("trips"), events.TripRequested, "T-redrive", events.TripRequestedData{TripID: "T-redrive", Request: tr})
	require.NoError(t, err)
	subject, err := events.Subject(req.Type(), req.Subject())
	require.NoError(t, err)
	h, err := events.EncodeHeaders(req)
	require.NoError(t, err)
	headers := map[string][]string{}
	for k, v := range h {
		headers[k] = []string{v}
	}
	action(events.OperatorActionData{Action: events.ActionRedrive, TripID: "T-redrive", Service: "hotel", Reason: "fixed", Operator: "ada", IdempotencyKey: "k3",
		DeadLetter: &events.ParkedEvent{Seq: 1, Stream: events.StreamTrips, StreamSeq: 42, Subject: subject, Consumer: "hotel", Reason: "boom", Headers: headers, Data: req.Data()}})
	testenv.Eventually(t, func() bool {
		s, err := saga.Steps(ctx, b.pool, "T-redrive")
		return err == nil && len(s) == 1 && s[0].Status == "done"
	}, "the re-driven trigger ran the step")
	var inboxRows int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM inbox WHERE event_id = $1 AND consumer = 'hotel' AND stream = 'TRIPS' AND stream_seq = 42", req.ID()).Scan(&inboxRows))
	require.Equal(t, 1, inboxRows)
}

// TestUndoLeakOfADoneStepWithoutTripRequested: a step done for a trip
// the trips service never took (no trip.requested on TRIPS: it ran on a
// forged trigger) is undone by key on the operator's undo_leak, with
// cause operator and no event; one done for a trip that has its
// trip.requested, or recorded longer ago than TRIPS keeps events, is
// refused: its own saga owns it.
func TestUndoLeakOfADoneStepWithoutTripRequested(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, _, js := testenv.JetStream(t)
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	r, err := saga.New(saga.Config{Pool: b.pool, Spec: hotel.Spec(b.hotelURL), Timing: fast, Origin: saga.TripsOrigin(js)})
	require.NoError(t, err)

	owned := "T-owned"
	e, err := events.New(events.Source("trips"), events.TripRequested, owned, events.TripRequestedData{TripID: owned, Request: trip("owned@x.io")})
	require.NoError(t, err)
	publishMsg(t, js, e, "", nil)
	for _, tr := range []string{owned, "T-forged", "T-old"} {
		request(t, b, r, tr, tr+"@x.io")
		runUntil(t, r, func() bool { return step(t, b, tr).Status == "done" }, "held")
	}

	require.Equal(t, "step was done for a trip with no trip.requested: undoing T-forged:hotel by key",
		operate(t, b, r, "T-forged", events.ActionUndoLeak, "charged for a forged hotel.held"))
	recoverPass(t, r)
	runUntil(t, r, func() bool { return step(t, b, "T-forged").Status == "compensated" }, "undone")
	require.Equal(t, "released", companyStatus(t, b, "T-forged:hotel"))
	require.Equal(t, saga.CauseOperator, step(t, b, "T-forged").UndoCause)
	for _, typ := range outboxTypes(t, b, "T-forged") {
		require.NotEqual(t, events.HotelReleased, typ, "no event: the action is the record")
	}

	require.Equal(t, "refused: step is done; its own saga owns the record",
		operate(t, b, r, owned, events.ActionUndoLeak, "mistake"))

	// Older than TRIPS keeps events: no trip.requested proves nothing.
	_, err = b.pool.Exec(ctx, "UPDATE steps SET created_at = now() - interval '31 days' WHERE trip_id = 'T-old'")
	require.NoError(t, err)
	require.Equal(t, "refused: step is done and older than the streams keep a trip.requested (720h0m0s); its own saga owns the record",
		operate(t, b, r, "T-old", events.ActionUndoLeak, "mistake"))
	require.Equal(t, "done", step(t, b, "T-old").Status)
	require.Equal(t, "done", step(t, b, owned).Status)
	require.Equal(t, "held", companyStatus(t, b, owned+":hotel"))
}
