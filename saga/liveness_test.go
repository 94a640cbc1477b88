package saga_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/services/hotel"
	"github.com/tripsaga/tripsaga/sim"
)

// TestLeasesOfReplicas: a replica never takes a row whose lease a live
// peer holds, even when the lease's time has not run out and the peer is
// slow; it takes it once the peer is dead (session gone and silent for the
// grace, or stopped), and a peer's crash is noticed without waiting for
// the lease.
func TestLeasesOfReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	aLive := liveness(t, b, "hotel-a")
	a := runnerLive(t, b, fast, aLive)
	bLive := liveness(t, b, "hotel-b")
	peer := runnerLive(t, b, fast, bLive)
	body, _ := hotel.Build("T-1", trip("one@x.io"))
	request(t, b, a, "T-1", "one@x.io")
	// A claimed the row and its call is in flight (the lease is long).
	_, err := b.pool.Exec(ctx, "UPDATE steps SET status = 'started', attempts = 1, next_attempt_at = now() + interval '1 hour', owner = $1 WHERE trip_id = 'T-1'", aLive.ID())
	require.NoError(t, err)
	_, err = b.company.Create(ctx, "T-1:hotel", body)
	require.NoError(t, err)

	n, err := peer.RecoveryPass(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a live peer's lease is not taken")
	require.Equal(t, "started", step(t, b, "T-1").Status)

	// A's session ends (SIGKILL), but its last beat is fresh: a network
	// blip looks the same, so the peer waits for the grace.
	killSession(t, b, aLive)
	_, err = b.pool.Exec(ctx, "UPDATE processes SET seen_at = now() WHERE id = $1", aLive.ID()) // its last beat
	require.NoError(t, err)
	n, err = peer.RecoveryPass(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "lock lost but beating recently: not yet dead")

	// Silent for longer than the grace: dead; its lease ends at once.
	_, err = b.pool.Exec(ctx, "UPDATE processes SET seen_at = now() - interval '1 minute' WHERE id = $1", aLive.ID())
	require.NoError(t, err)
	n, err = peer.RecoveryPass(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	s := step(t, b, "T-1")
	require.Equal(t, "done", s.Status)
	require.Equal(t, 2, s.Attempts, "asked again by the same key")
	holds, err := b.company.List(ctx, "")
	require.NoError(t, err)
	require.Len(t, holds, 1, "held once")
	var owner *int32
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT owner FROM steps WHERE trip_id = 'T-1'").Scan(&owner))
	require.Nil(t, owner, "no call in flight, no owner")

	// A peer that stops (Close: marked gone) hands its leases over at
	// once, though its beat is fresh.
	cLive := liveness(t, b, "hotel-c")
	request(t, b, peer, "T-2", "two@x.io")
	_, err = b.pool.Exec(ctx, "UPDATE steps SET status = 'started', attempts = 1, next_attempt_at = now() + interval '1 hour', owner = $1 WHERE trip_id = 'T-2'", cLive.ID())
	require.NoError(t, err)
	n, err = peer.RecoveryPass(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	cLive.Close()
	n, err = peer.RecoveryPass(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "done", step(t, b, "T-2").Status)
}

// TestClaimsNameTheirOwner: a lease taken by the runner carries its
// process's id while the call is in flight, and the answer's write clears
// it.
func TestClaimsNameTheirOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	live := liveness(t, b, "hotel-x")
	// A call timeout no loaded machine reaches: the 150 ms answer must be
	// an answer (at load 8 a 200 ms timeout made it unknown).
	r := runnerLive(t, b, unhurried, live)
	request(t, b, r, "T-o", "o@x.io")
	// The company answers slowly: the lease is visible during the call.
	require.NoError(t, sim.AddFault(ctx, b.hotelURL, sim.Rule{Op: sim.OpHold, Fault: sim.FaultSlowAnswer, DelayMS: 150, Times: 1}))
	owner := func() *int32 {
		var o *int32
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT owner FROM steps WHERE trip_id = 'T-o'").Scan(&o))
		return o
	}
	done := make(chan error, 1)
	go func() { _, err := r.RecoveryPass(ctx); done <- err }()
	testenv.Eventually(t, func() bool { o := owner(); return o != nil && *o == live.ID() }, "the lease names its owner during the call")
	require.NoError(t, <-done)
	require.Equal(t, "done", step(t, b, "T-o").Status)
	require.Nil(t, owner(), "answered: no owner")
}
