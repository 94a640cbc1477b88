package saga_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/sagatest"
	"github.com/tripsaga/tripsaga/services/hotel"
	"github.com/tripsaga/tripsaga/sim"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type bundle struct {
	pool     *pgxpool.Pool
	hotelURL string
	company  *provider.Client
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	pool, url := testenv.SchemaPool(t, "hotel", tripsql.SetSaga)
	sims, err := sim.New(ctx, sim.Config{DatabaseURL: url})
	require.NoError(t, err)
	srv := httptest.NewServer(sims.Handler())
	t.Cleanup(func() { srv.Close(); sims.Close() })
	return &bundle{pool: pool, hotelURL: srv.URL + "/hotel", company: provider.Hotel(srv.URL + "/hotel")}
}

var fast = saga.Timing{
	CallTimeout: 200 * time.Millisecond, StepDeadline: 1500 * time.Millisecond,
	RetryBackoffMin: 20 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond,
	UndoBackoffMin: 20 * time.Millisecond, UndoBackoffMax: 100 * time.Millisecond,
	IncidentAfter: 3, VerifyAfter: 700 * time.Millisecond, PollInterval: 20 * time.Millisecond,
}

// unhurried is fast with calls that do not time out on a loaded machine:
// for the tests that count attempts, where a 200 ms call timed out at a
// load of 6 and was asked again by key (a second attempt, rightly).
var unhurried = func() saga.Timing {
	t := fast
	t.CallTimeout, t.StepDeadline = 10*time.Second, time.Minute
	return t
}()

func runner(t *testing.T, b *bundle, timing saga.Timing) *saga.Runner {
	r, err := saga.New(saga.Config{Pool: b.pool, Spec: hotel.Spec(b.hotelURL), Timing: timing})
	require.NoError(t, err)
	return r
}

// runnerLive is a runner of a replica whose liveness is live.
func runnerLive(t *testing.T, b *bundle, timing saga.Timing, live *saga.Liveness) *saga.Runner {
	r, err := saga.New(saga.Config{Pool: b.pool, Spec: hotel.Spec(b.hotelURL), Timing: timing, Liveness: live})
	require.NoError(t, err)
	return r
}

// liveness registers a replica named instance; it is closed (gone) at the
// test's end.
func liveness(t *testing.T, b *bundle, instance string) *saga.Liveness {
	l := saga.NewLiveness(b.pool, "hotel", instance, nil)
	require.NoError(t, l.Start(context.Background()))
	t.Cleanup(l.Close)
	return l
}

// killSession ends the PostgreSQL session holding l's advisory lock, as a
// SIGKILL of its process would.
func killSession(t *testing.T, b *bundle, l *saga.Liveness) {
	var ok bool
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND objid::bigint = $1 AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())", l.ID()).Scan(&ok))
	require.True(t, ok)
	testenv.Eventually(t, func() bool {
		var n int
		_ = b.pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND objid::bigint = $1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())", l.ID()).Scan(&n)
		return n == 0
	}, "the session's lock is released")
}

func trip(email string) events.TripRequest {
	return events.TripRequest{
		Traveler: events.Person{Name: "Ada", Email: email},
		Hotel:    events.HotelRequest{PropertyID: "P-1", CheckIn: "2026-12-18", Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: "2026-12-18", Return: "2026-12-20"},
		Payment:  events.PaymentRequest{CardToken: "tok_ok", AmountCents: 100, Currency: "USD"},
	}
}

func request(t *testing.T, b *bundle, r *saga.Runner, tripID, email string) bool {
	ctx := context.Background()
	tr := trip(email)
	body, err := hotel.Build(tripID, tr)
	require.NoError(t, err)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	ok, err := r.Request(ctx, tx, saga.Request{TripID: tripID, Body: body, Carried: sagatest.JSON(t, tr)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return ok
}

func undo(t *testing.T, b *bundle, r *saga.Runner, tripID string) {
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, r.RequestUndo(ctx, tx, tripID))
	require.NoError(t, tx.Commit(ctx))
}

func step(t *testing.T, b *bundle, tripID string) saga.StepView {
	steps, err := saga.Steps(context.Background(), b.pool, tripID)
	require.NoError(t, err)
	require.Len(t, steps, 1)
	return steps[0]
}

// outboxTypes returns the CloudEvents types written to the outbox for trip.
func outboxTypes(t *testing.T, b *bundle, tripID string) []string {
	rows, err := b.pool.Query(context.Background(), "SELECT headers->>'ce-type' FROM outbox WHERE headers->>'ce-subject' = $1 ORDER BY id", tripID)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	return out
}

func companyStatus(t *testing.T, b *bundle, key string) string {
	res, err := b.company.Status(context.Background(), key)
	require.NoError(t, err)
	return res.Status
}

func recoverPass(t *testing.T, r *saga.Runner) {
	_, err := r.RecoveryPass(context.Background())
	require.NoError(t, err)
}

// runUntil runs the runner until cond holds.
func runUntil(t *testing.T, r *saga.Runner, cond func() bool, msg string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, cond, msg)
}

func TestRunner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("DoneWritesStepAndEventTogether", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := runner(t, b, unhurried)
		require.True(t, request(t, b, r, "T-ok", "ok@x.io"))
		require.False(t, request(t, b, r, "T-ok", "ok@x.io"), "a redelivered trigger records nothing new")
		recoverPass(t, r)
		s := step(t, b, "T-ok")
		require.Equal(t, "done", s.Status)
		require.Equal(t, "T-ok:hotel", s.IdempotencyKey)
		require.NotEmpty(t, s.CompanyRef)
		require.Equal(t, 1, s.Attempts)
		require.Equal(t, []string{events.HotelHeld}, outboxTypes(t, b, "T-ok"))
		require.Equal(t, "held", companyStatus(t, b, "T-ok:hotel"))
	})

	t.Run("BusinessRejectionIsFinalAndNeverRetried", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultSoldOut}))
		r := runner(t, b, unhurried)
		request(t, b, r, "T-so", "so@x.io")
		recoverPass(t, r)
		recoverPass(t, r)
		s := step(t, b, "T-so")
		require.Equal(t, "rejected", s.Status)
		require.Equal(t, "sold out", s.Reason)
		require.Equal(t, 1, s.Attempts)
		require.Equal(t, []string{events.HotelRejected}, outboxTypes(t, b, "T-so"))
	})

	t.Run("LostAnswerIsLearnedByTheSameKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultLoseAnswer, Times: 1}))
		r := runner(t, b, fast)
		request(t, b, r, "T-lost", "lost@x.io")
		runUntil(t, r, func() bool { return step(t, b, "T-lost").Status == "done" }, "done after asking again")
		s := step(t, b, "T-lost")
		require.GreaterOrEqual(t, s.Attempts, 1)
		require.Equal(t, []string{events.HotelHeld}, outboxTypes(t, b, "T-lost"))
		holds, err := b.company.List(ctx, "")
		require.NoError(t, err)
		require.Len(t, holds, 1, "one hold, whatever the retries")
	})

	t.Run("UnknownUntilTheDeadlineIsUndoneByKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultHang, DelayMS: 60000}))
		r := runner(t, b, fast)
		request(t, b, r, "T-hang", "hang@x.io")
		runUntil(t, r, func() bool { return step(t, b, "T-hang").Status == "failed" }, "failed at the deadline")
		s := step(t, b, "T-hang")
		require.Equal(t, "deadline", s.UndoCause)
		require.Greater(t, s.Attempts, 1, "asked again before giving up")
		require.Equal(t, []string{events.HotelFailed}, outboxTypes(t, b, "T-hang"))
		require.Equal(t, "none", companyStatus(t, b, "T-hang:hotel"))
	})

	t.Run("LateCommitAfterUndoIsFoundAndUndone", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Every hold commits 1 s after the call, long after the caller gave up.
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultCommitLate, DelayMS: 1000}))
		timing := fast
		timing.StepDeadline = 400 * time.Millisecond
		timing.VerifyAfter = 1500 * time.Millisecond
		r := runner(t, b, timing)
		request(t, b, r, "T-late", "late@x.io")
		runUntil(t, r, func() bool {
			s := step(t, b, "T-late")
			return s.Status == "failed" && companyStatus(t, b, "T-late:hotel") == "released"
		}, "the late hold is released")
		s := step(t, b, "T-late")
		require.Contains(t, s.Outcome, "undo: 200 released")
	})

	t.Run("CommitLaterThanTheFirstCheckIsStillUndone", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The hold commits 2.5 s after the call: after the deadline undo
		// (0.4 s) and after the first check (0.7 s later).
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultCommitLate, DelayMS: 2500}))
		timing := fast
		timing.StepDeadline = 400 * time.Millisecond
		timing.VerifyAfter = 700 * time.Millisecond
		r := runner(t, b, timing)
		request(t, b, r, "T-later", "later@x.io")
		runUntil(t, r, func() bool {
			return step(t, b, "T-later").Status == "failed" && companyStatus(t, b, "T-later:hotel") == "released"
		}, "the hold committed after the first check is released")
	})

	t.Run("CompensationRetriesRaiseAnIncidentAndGoOn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpRelease, Fault: sim.FaultFail, Times: 5}))
		r := runner(t, b, fast)
		request(t, b, r, "T-comp", "comp@x.io")
		// Held first (a call slower than the test's 200 ms call timeout on
		// a loaded machine is unknown and asked again).
		runUntil(t, r, func() bool { return step(t, b, "T-comp").Status == "done" }, "held")
		undo(t, b, r, "T-comp")
		require.Equal(t, "compensating", step(t, b, "T-comp").Status)
		runUntil(t, r, func() bool { return step(t, b, "T-comp").Status == "compensated" }, "compensated in the end")
		s := step(t, b, "T-comp")
		require.Equal(t, 6, s.UndoAttempts)
		require.Equal(t, []string{events.HotelHeld, events.HotelReleased}, outboxTypes(t, b, "T-comp"))
		require.Equal(t, "released", companyStatus(t, b, "T-comp:hotel"))
		inc, err := saga.Incidents(ctx, b.pool)
		require.NoError(t, err)
		require.Len(t, inc, 1)
		require.Equal(t, saga.IncidentCompensationStuck, inc[0].Kind)
		require.NotNil(t, inc[0].ResolvedAt, "resolved once the undo worked")
	})

	t.Run("ARefusedCompensationRaisesAnIncidentAtOnceAndSlowsToTheLongestBackoff", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpRelease, Fault: sim.FaultRefuse, Reason: "property closed"}))
		slow := fast
		slow.UndoBackoffMax = time.Hour
		r := runner(t, b, slow)
		request(t, b, r, "T-refused", "refused@x.io")
		// Held first (a call slower than the test's 200 ms call timeout on
		// a loaded machine is unknown and asked again).
		runUntil(t, r, func() bool { return step(t, b, "T-refused").Status == "done" }, "held")
		undo(t, b, r, "T-refused")
		runUntil(t, r, func() bool {
			inc, err := saga.Incidents(ctx, b.pool)
			require.NoError(t, err)
			return len(inc) == 1
		}, "an incident is raised")
		inc, err := saga.Incidents(ctx, b.pool)
		require.NoError(t, err)
		require.Equal(t, saga.IncidentCompensationRefused, inc[0].Kind, "a refusal is not an unknown outcome")
		require.Equal(t, 1, inc[0].Attempts, "raised at the first refusal, not after IncidentAfter attempts")
		require.Contains(t, inc[0].LastError, "release refused by the company: 422 property closed")
		s := step(t, b, "T-refused")
		require.Equal(t, "compensating", s.Status, "the trip stays canceling while the undo is owed")
		require.Equal(t, 1, s.UndoAttempts)
		var waitsLong bool
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT next_attempt_at > now() + interval '30 minutes' FROM steps WHERE trip_id = 'T-refused'").Scan(&waitsLong))
		require.True(t, waitsLong, "the next try waits the longest backoff")
		require.Equal(t, "held", companyStatus(t, b, "T-refused:hotel"))

		// A person fixes the cause and asks for a retry now.
		require.NoError(t, sim.ClearFaults(ctx, b.hotelURL))
		_, err = b.pool.Exec(ctx, "UPDATE steps SET next_attempt_at = now() WHERE trip_id = 'T-refused'")
		require.NoError(t, err)
		runUntil(t, r, func() bool { return step(t, b, "T-refused").Status == "compensated" }, "compensated once the company accepts")
		require.Equal(t, "released", companyStatus(t, b, "T-refused:hotel"))
		inc, err = saga.Incidents(ctx, b.pool)
		require.NoError(t, err)
		require.NotNil(t, inc[0].ResolvedAt, "resolved once the undo worked")
	})

	t.Run("ATriggerRecordsTheStepStartedAndTheCallFollowsItsCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Polls and leases are long: only the after-commit launch can
		// make the call here.
		slowPoll := fast
		slowPoll.PollInterval = time.Hour
		slowPoll.CallTimeout = time.Second
		slowPoll.StepDeadline = time.Hour
		r := runner(t, b, slowPoll)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = r.Run(rctx); close(done) }()
		defer func() { cancel(); <-done }()
		testenv.Eventually(t, r.Running, "runner running")

		tr := trip("direct@x.io")
		body, err := hotel.Build("T-direct", tr)
		require.NoError(t, err)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		wctx, committed := outbox.WithAfterCommit(ctx, nil)
		isNew, err := r.Request(wctx, tx, saga.Request{TripID: "T-direct", Body: body, Carried: sagatest.JSON(t, tr)})
		require.NoError(t, err)
		require.True(t, isNew)
		require.Equal(t, "none", companyStatus(t, b, "T-direct:hotel"), "no call before the commit")
		require.NoError(t, tx.Commit(ctx))
		s := step(t, b, "T-direct")
		require.Equal(t, "started", s.Status, "written down as started, in the trigger's own transaction")
		require.Equal(t, 1, s.Attempts)
		committed()
		testenv.Eventually(t, func() bool { return step(t, b, "T-direct").Status == "done" }, "called right after the commit")
		require.Equal(t, "held", companyStatus(t, b, "T-direct:hotel"))
		require.Equal(t, []string{events.HotelHeld}, outboxTypes(t, b, "T-direct"))
	})

	t.Run("UndoBeforeItsStepVoidsIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := runner(t, b, fast)
		undo(t, b, r, "T-void")
		require.False(t, request(t, b, r, "T-void", "void@x.io"), "the late trigger records nothing")
		recoverPass(t, r)
		require.Equal(t, "voided", step(t, b, "T-void").Status)
		require.Equal(t, "none", companyStatus(t, b, "T-void:hotel"), "the company is never called")
		require.Equal(t, []string{events.HotelReleased}, outboxTypes(t, b, "T-void"), "the undo is reported done, so the step before it is undone too")
	})

	t.Run("UndoRacingItsTriggerUndoesTheStep", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := runner(t, b, fast)
		tr := trip("race@x.io")
		body, err := hotel.Build("T-race", tr)
		require.NoError(t, err)
		tx1, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		_, err = r.Request(ctx, tx1, saga.Request{TripID: "T-race", Body: body, Carried: sagatest.JSON(t, tr)})
		require.NoError(t, err)
		undone := make(chan error, 1)
		go func() {
			tx2, err := b.pool.Begin(ctx)
			if err == nil {
				if err = r.RequestUndo(ctx, tx2, "T-race"); err == nil {
					err = tx2.Commit(ctx)
				}
			}
			undone <- err
		}()
		// The undo waits on the trigger's uncommitted row, then sees it.
		testenv.Eventually(t, func() bool {
			var waiting bool
			_ = b.pool.QueryRow(ctx, "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()").Scan(&waiting)
			return waiting
		}, "the undo waits on the trigger's row")
		require.NoError(t, tx1.Commit(ctx))
		require.NoError(t, <-undone)
		recoverPass(t, r)
		require.Equal(t, "compensated", step(t, b, "T-race").Status, "the undo is not lost")
		require.NotEqual(t, "held", companyStatus(t, b, "T-race:hotel"))
	})

	t.Run("RecoveryPassFinishesAStepLeftStartedByACrash", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		crashedLive := liveness(t, b, "hotel-1")
		crashed := runnerLive(t, b, fast, crashedLive)
		request(t, b, crashed, "T-crash", "crash@x.io")
		// The crashed process wrote "started" with a lease of its own and
		// its call reached the company, which committed; then it died
		// (SIGKILL: its PostgreSQL session ended) before writing the answer.
		_, err := b.pool.Exec(ctx, "UPDATE steps SET status = 'started', attempts = 1, next_attempt_at = now() + interval '1 hour', owner = $1 WHERE trip_id = 'T-crash'", crashedLive.ID())
		require.NoError(t, err)
		body, _ := hotel.Build("T-crash", trip("crash@x.io"))
		_, err = b.company.Create(ctx, "T-crash:hotel", body)
		require.NoError(t, err)
		killSession(t, b, crashedLive)
		// Its successor (same instance name) takes the row at start,
		// without waiting for the lease or the grace.
		restarted := runnerLive(t, b, fast, liveness(t, b, "hotel-1"))
		n, err := restarted.RecoveryPass(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		s := step(t, b, "T-crash")
		require.Equal(t, "done", s.Status)
		require.Equal(t, 2, s.Attempts, "asked again by the same key")
		holds, err := b.company.List(ctx, "")
		require.NoError(t, err)
		require.Len(t, holds, 1, "held once")
	})
}

func TestRunnerLearnsByStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ForwardAnswerAlwaysLostIsLearnedByGet", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultLoseAnswer}))
		r := runner(t, b, fast)
		request(t, b, r, "T-get", "get@x.io")
		recoverPass(t, r)
		s := step(t, b, "T-get")
		require.Equal(t, "done", s.Status, "GET /holds/{key} says held")
		require.Equal(t, []string{events.HotelHeld}, outboxTypes(t, b, "T-get"))
	})

	t.Run("UndoAnswerAlwaysLostIsLearnedByGet", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpRelease, Fault: sim.FaultLoseAnswer}))
		r := runner(t, b, fast)
		request(t, b, r, "T-rel", "rel@x.io")
		recoverPass(t, r)
		undo(t, b, r, "T-rel")
		recoverPass(t, r)
		s := step(t, b, "T-rel")
		require.Equal(t, "compensated", s.Status, "GET /holds/{key} says released")
		require.Equal(t, "released", companyStatus(t, b, "T-rel:hotel"))
		require.Equal(t, []string{events.HotelHeld, events.HotelReleased}, outboxTypes(t, b, "T-rel"))
	})
}
