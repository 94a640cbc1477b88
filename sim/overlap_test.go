package sim

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOverlappingCallsAreCounted: two writes of one key in flight at once
// count as an overlap; a retry after the first caller gave up does not.
func TestOverlappingCallsAreCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	hotel := b.company("hotel")
	st, err := GetStats(ctx, hotel)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st)

	// A caller that gives up (hang until it does), then a retry by key:
	// not an overlap.
	require.NoError(t, AddFault(ctx, hotel, Rule{Op: OpHold, Fault: FaultHang, Times: 1}))
	_, _, err = send(t, client(200*time.Millisecond), http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
	require.Error(t, err, "the hang outlasts the caller")
	status, _ := call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
	require.Equal(t, http.StatusCreated, status)
	st, err = GetStats(ctx, hotel)
	require.NoError(t, err)
	require.Zero(t, st.OverlappingCalls, "a retry after giving up is no overlap")
	require.EqualValues(t, 1, st.MaxInFlightPerKey)

	// Two callers of one key at once (a slow answer keeps the first in
	// flight): one overlap.
	require.NoError(t, AddFault(ctx, hotel, Rule{Op: OpHold, Fault: FaultSlowAnswer, DelayMS: 1000, Times: 1}))
	first := make(chan int, 1)
	go func() {
		s, _ := call(t, http.MethodPost, hotel+"/holds", "T-2:hotel", holdBody("T-2"))
		first <- s
	}()
	waitInFlight(t, b, "hotel", "T-2:hotel")
	status, _ = call(t, http.MethodPost, hotel+"/holds", "T-2:hotel", holdBody("T-2"))
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, http.StatusCreated, <-first)
	st, err = GetStats(ctx, hotel)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.OverlappingCalls)
	require.EqualValues(t, 2, st.MaxInFlightPerKey)
}

// waitInFlight waits until a write of key is in flight at company.
func waitInFlight(t *testing.T, b *testBundle, company, key string) {
	t.Helper()
	for _, c := range b.sims.companies {
		if c.sp.name != company {
			continue
		}
		require.Eventually(t, func() bool {
			c.overlap.mu.Lock()
			defer c.overlap.mu.Unlock()
			return c.overlap.inFlight[key] > 0
		}, 10*time.Second, 5*time.Millisecond)
		return
	}
	t.Fatalf("no company %s", company)
}

// TestALostAnswerRetriedAtOnceIsNoOverlap: a write whose connection is
// closed without an answer (lose_answer) is over for its caller, which
// may send the key again at once (Go's transport does so by itself for a
// request with an Idempotency-Key on a reused connection): no overlap.
func TestALostAnswerRetriedAtOnceIsNoOverlap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	hotel := b.company("hotel")
	keepAlive := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: 10 * time.Second}
	for i := range 30 {
		key := fmt.Sprintf("T-lost%d:hotel", i)
		// A first call opens the connection the lost one reuses.
		status, _, err := send(t, keepAlive, http.MethodPost, hotel+"/holds", fmt.Sprintf("T-warm%d:hotel", i), holdBody(fmt.Sprintf("T-warm%d", i)))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
		require.NoError(t, AddFault(ctx, hotel, Rule{Op: OpHold, Fault: FaultLoseAnswer, Times: 1}))
		status, _, err = send(t, keepAlive, http.MethodPost, hotel+"/holds", key, holdBody(fmt.Sprintf("T-lost%d", i)))
		require.NoError(t, err, "the transport sent it again by itself")
		require.Equal(t, http.StatusCreated, status)
	}
	st, err := GetStats(ctx, hotel)
	require.NoError(t, err)
	require.Zero(t, st.OverlappingCalls)
}
