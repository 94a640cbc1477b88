package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
)

// A --steps the catalogue refuses stops the run before anything starts,
// naming the flag and why.
func TestChaosRefusesBadSteps(t *testing.T) {
	o := chaosOptions{duration: time.Minute, rate: 5, replicas: 1, faults: "kill", dir: t.TempDir(), dupWindow: events.DuplicateWindow}
	for steps, want := range map[string]string{
		"hotel,payment,car,insurance": "compensable step insurance comes after the pivot car",
		"hotel,payment,boat":          "boat",
	} {
		o.steps = steps
		err := runChaos(context.Background(), io.Discard, io.Discard, o)
		require.ErrorContains(t, err, `--steps "`+steps+`"`)
		require.ErrorContains(t, err, want)
	}
}
