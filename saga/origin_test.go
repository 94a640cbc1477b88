package saga_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/sagatest"
	"github.com/tripsaga/tripsaga/services/payment"
)

// TestOriginLostByItsStream: a trigger from another step service whose
// trip.requested is missing from the TRIPS stream is asked again while the
// event is younger than the origin grace (the stream may have lost an
// acknowledged trip.requested that the trips service's outbox publishes
// again), and carried out once it is back; one older than the grace is
// parked at once, naming why.
func TestOriginLostByItsStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, _, js := testenv.JetStream(t)
	require.NoError(t, events.EnsureStreams(ctx, js, events.Default))
	paymentsURL := b.hotelURL[:len(b.hotelURL)-len("/hotel")] + "/payments"

	const lost, forged = "T-origin-lost", "T-origin-forged"
	req := trip("origin@x.io")
	var (
		mu    sync.Mutex
		back  bool         // the lost trip.requested is in its stream again
		asked atomic.Int32 // origin reads of the lost trip
	)
	origin := func(_ context.Context, id string) (json.RawMessage, error) {
		if id != lost {
			return nil, nil
		}
		asked.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if !back {
			return nil, nil
		}
		return sagatest.JSON(t, req), nil
	}
	svc, err := saga.NewService(saga.ServiceConfig{
		Pool: b.pool, JetStream: js, Catalogue: events.Default, Family: events.TripVersions(), Spec: payment.Spec(paymentsURL), Build: saga.Builder(payment.Build), Timing: fast,
		Origin: origin, OriginGrace: time.Hour,
	})
	require.NoError(t, err)
	runService(t, svc)

	held := func(id string, at time.Time) {
		e := versioned(t, "hotel", events.HotelHeld, id, "", events.StepData{TripID: id, Step: "hotel", IdempotencyKey: id + ":hotel", CompanyRef: "H-1", Request: sagatest.JSON(t, req)})
		e.SetTime(at)
		publishMsg(t, js, e, "", nil)
	}
	held(lost, time.Now())
	testenv.Eventually(t, func() bool { return asked.Load() >= 3 }, "the missing origin is asked again")
	steps, err := saga.Steps(ctx, b.pool, lost)
	require.NoError(t, err)
	require.Empty(t, steps, "nothing recorded, nothing charged while the origin is missing")

	mu.Lock()
	back = true
	mu.Unlock()
	testenv.Eventually(t, func() bool {
		s, err := saga.Steps(ctx, b.pool, lost)
		return err == nil && len(s) == 1 && s[0].Status == "done"
	}, "charged once its trip.requested is back")

	// An event stamped before the grace: its trip.requested is not coming
	// back; parked, never charged.
	dl, err := js.Stream(ctx, events.StreamDeadLetter)
	require.NoError(t, err)
	held(forged, time.Now().Add(-2*time.Hour))
	testenv.Eventually(t, func() bool {
		info, err := dl.Info(ctx)
		if err != nil {
			return false
		}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			m, err := dl.GetMsg(ctx, seq)
			if err == nil && m.Header.Get("ce-subject") == forged {
				require.Contains(t, m.Header.Get(inbox.HeaderDeadReason), "no trip.requested for "+forged+": not a trip the trips service took")
				return true
			}
		}
		return false
	}, "the event older than the grace is parked")
	steps, err = saga.Steps(ctx, b.pool, forged)
	require.NoError(t, err)
	require.Empty(t, steps)
}
