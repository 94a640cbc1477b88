package sim

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A rule with a Chance applies only when its draw is below the Chance; a
// request it skips goes on to the next rule and is not counted.
func TestChanceDraws(t *testing.T) {
	t.Parallel()
	draws := []float64{0.9, 0.1, 0.5, 0.29, 0.3}
	f := &faultSet{now: time.Now, draw: func() float64 { d := draws[0]; draws = draws[1:]; return d }}
	f.add(Rule{Op: OpHold, Fault: FaultFail, Chance: 0.3})
	f.add(Rule{Op: OpHold, Fault: FaultLoseAnswer})

	got := []string{}
	for range 4 {
		got = append(got, f.take(OpHold, nil, false).Fault)
	}
	// 0.9: skipped, the next rule; 0.1: applies; 0.5: skipped; 0.29: applies.
	require.Equal(t, []string{FaultLoseAnswer, FaultFail, FaultLoseAnswer, FaultFail}, got)
	rules := f.list()
	require.Equal(t, 2, rules[0].Applied)
	require.Equal(t, 2, rules[1].Applied)

	// Chance 0 (unset) and 1 never draw.
	g := &faultSet{now: time.Now, draw: func() float64 { panic("no draw for a certain rule") }}
	g.add(Rule{Op: OpHold, Fault: FaultFail})
	g.add(Rule{Op: OpHold, Fault: FaultFail, Chance: 1})
	require.NotNil(t, g.take(OpHold, nil, false))
}

// Over HTTP: a chance out of range is refused; a rule is removed by its
// id and the others stay; with chance 0.5 about half the holds fail.
func TestChanceOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hotel := b.company("hotel")
	ctx := context.Background()
	for _, c := range []string{`-0.1`, `1.5`} {
		status, body := call(t, http.MethodPost, hotel+"/_faults", "", `{"op":"hold","fault":"fail","chance":`+c+`}`)
		require.Equal(t, http.StatusUnprocessableEntity, status, body)
		require.Contains(t, body, "chance")
	}
	keep, err := AddFaultRule(ctx, hotel, Rule{Op: OpRelease, Fault: FaultFail})
	require.NoError(t, err)
	half, err := AddFaultRule(ctx, hotel, Rule{Op: OpHold, Fault: FaultFail, Chance: 0.5})
	require.NoError(t, err)
	require.Equal(t, 0.5, half.Chance)
	require.NotEmpty(t, half.ID)

	failed := 0
	const n = 200
	for i := range n {
		status, _ := call(t, http.MethodPost, hotel+"/holds", "T-"+strconv.Itoa(i)+":hotel", holdBody("T-"+strconv.Itoa(i)))
		if status == http.StatusServiceUnavailable {
			failed++
		} else {
			require.Equal(t, http.StatusCreated, status)
		}
	}
	// Binomial(200, 0.5): outside 60..140 has a probability below 1e-8.
	require.Greater(t, failed, 60)
	require.Less(t, failed, 140)

	removed, err := RemoveFault(ctx, hotel, half.ID)
	require.NoError(t, err)
	require.Equal(t, failed, removed.Applied)
	_, err = RemoveFault(ctx, hotel, half.ID)
	require.ErrorContains(t, err, "404")
	rules, err := ListFaults(ctx, hotel)
	require.NoError(t, err)
	require.Len(t, rules, 1)
	require.Equal(t, keep.ID, rules[0].ID)
	status, _ := call(t, http.MethodPost, hotel+"/holds", "T-after:hotel", holdBody("T-after"))
	require.Equal(t, http.StatusCreated, status)
}
