package saga_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/sim"
)

// TestRetriesDuringACallInFlight sends two retry_undo while an undo's call
// hangs (3 s): neither moves the lease (no second release of the key
// starts: the hotel counts no overlap), both say the row is due once the
// call ends, and the owner honours it: the failed undo is tried again at
// once although its backoff is an hour.
func TestRetriesDuringACallInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	timing := fast
	timing.CallTimeout, timing.StepDeadline = 5*time.Second, 20*time.Second
	timing.UndoBackoffMin, timing.UndoBackoffMax = time.Hour, time.Hour
	live := liveness(t, b, "hotel-inflight")
	// The replica beats, as a running service does: a replica whose
	// liveness no beat confirms is fenced and calls nothing.
	lctx, stopBeats := context.WithCancel(ctx)
	beating := make(chan struct{})
	go func() { _ = live.Run(lctx); close(beating) }()
	t.Cleanup(func() { stopBeats(); <-beating })
	r := runnerLive(t, b, timing, live)
	request(t, b, r, "T-inflight", "inflight@x.io")
	runUntil(t, r, func() bool { return step(t, b, "T-inflight").Status == "done" }, "held")

	require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpRelease, Fault: sim.FaultHang, DelayMS: 3000, Times: 1}))
	undo(t, b, r, "T-inflight")
	// One Run throughout: its end would abandon the call in flight.
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = r.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, func() bool {
		st, err := sim.GetStats(ctx, b.hotelURL)
		require.NoError(t, err)
		// The hold's write, then the release's: in flight now.
		return st.Writes >= 2
	}, "the release is in flight")
	for _, reason := range []string{"first operator", "second operator"} {
		require.Equal(t, "0 unfinished step(s) due now, 1 as soon as its call in flight ends",
			operate(t, b, r, "T-inflight", events.ActionRetryUndo, reason), "the call in flight keeps its lease")
	}
	testenv.Eventually(t, func() bool { return step(t, b, "T-inflight").Status == "compensated" }, "released")
	require.Equal(t, 2, step(t, b, "T-inflight").UndoAttempts, "the hung release, then one more at once, not after the hour's backoff")
	st, err := sim.GetStats(ctx, b.hotelURL)
	require.NoError(t, err)
	require.Zero(t, st.OverlappingCalls, "no second release of the key while the first was in flight")
	require.Equal(t, "released", companyStatus(t, b, "T-inflight:hotel"))
}
