package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/reconciler"
)

// TestSituationsWithInsurance runs every situation of the demo once more
// on a stack with the optional insurance step (STEPS=hotel,insurance,
// payment,car): `up` starts the insurance service, every trip passes
// through the insurer, the policy is judged with the other records, and
// the insurer rejecting cancels the trip with the hold released and
// nothing charged. Skipped when the whole suite already runs with four
// steps (STEPS in the environment).
func TestSituationsWithInsurance(t *testing.T) {
	require.NotEmpty(t, bin, "TestMain builds the binary")
	if demo.InsuranceOn(events.Selected()) {
		t.Skip("STEPS names insurance: TestSituations runs every situation with four steps")
	}
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o711))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := stack.Start(ctx, stack.Config{Dir: filepath.Join(dir, "stack"), Binary: bin, Env: []string{
		reconciler.OperatorTokenEnv + "=" + e2eToken,
		events.StepsVar + "=hotel,insurance,payment,car",
	}})
	require.NoError(t, err)
	t.Cleanup(s.Stop) // after the parallel subtests
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range append(stack.Processes, "insurance") {
				b, _ := os.ReadFile(s.LogPath(name))
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("==== %s log (tail)\n%s", name, b)
			}
		}
	})
	require.Contains(t, s.Instances(), "insurance", "up starts the insurance service when STEPS names it")
	checkSituations(t, demo.SituationsWith(true), func() *demo.Env { return envOf(s, true) })
}

// triggeredBy returns the service whose step the running catalogue starts
// on typ: the payment on hotel.held, or the insurance with four steps.
func triggeredBy(typ string) string {
	for _, s := range events.Selected().Steps {
		if slices.Contains(s.Trigger, typ) {
			return s.Service
		}
	}
	return ""
}

// consumersOf returns every service of the running catalogue that
// consumes typ, in the catalogue's order.
func consumersOf(typ string) []string {
	var out []string
	for _, svc := range events.Selected().Services() {
		if slices.Contains(events.Selected().Consumes(svc), typ) {
			out = append(out, svc)
		}
	}
	return out
}

// timelineColumns are the console's columns of a booked trip: trips, then
// each service of the saga in order.
func timelineColumns() []string {
	out := []string{"trips"}
	for _, s := range events.Selected().Saga() {
		out = append(out, s.Service)
	}
	return out
}
