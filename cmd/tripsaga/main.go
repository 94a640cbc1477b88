// Command tripsaga runs the trip saga: one service process (serve), the
// whole system on a laptop (up), the demo of every failure situation
// (demo), the whole system under random faults and kills, audited
// (chaos), a projection rebuilt from the streams (replay), a throughput
// measurement (bench), or a health check of a running process (health).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/events"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := rootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "tripsaga:", err)
		var ce configError
		if errors.As(err, &ce) {
			os.Exit(2)
		}
		var xe exitCodeError
		if errors.As(err, &xe) {
			os.Exit(xe.code)
		}
		os.Exit(1)
	}
}

// configError is a configuration the process refuses to start with (an
// environment variable it cannot use): main exits 2 on it, as for a
// usage error, after one line naming the variable.
type configError struct{ err error }

func (e configError) Error() string { return e.err.Error() }
func (e configError) Unwrap() error { return e.err }

// stepsWhileBuilding is the catalogue of STEPS for what a command shows
// before it runs (a flag's default, its help): the default order when
// STEPS is invalid, which [checkSteps] then refuses.
func stepsWhileBuilding() events.Catalogue {
	c, err := events.ParseSteps(os.Getenv(events.StepsVar))
	if err != nil {
		return events.Default
	}
	return c
}

// checkSteps refuses a STEPS the catalogue cannot build (an unknown step,
// one named twice, a compensable step after the pivot) before any
// command runs, so no process panics on it (events.Selected panics).
func checkSteps(*cobra.Command, []string) error {
	if _, err := events.ParseSteps(os.Getenv(events.StepsVar)); err != nil {
		return configError{err}
	}
	return nil
}

// rootCmd returns the tripsaga command with every subcommand.
func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "tripsaga",
		Short:         "A choreographed saga: hotel, payment and car, undone if anything fails",
		SilenceUsage:  true,
		SilenceErrors: true,
		// Every command, and its --help (which runs no hook), works on
		// a bad STEPS until then; the command itself is refused.
		PersistentPreRunE: checkSteps,
	}
	root.AddCommand(serveCmd(), upCmd(), demoCmd(), replayCmd(), benchCmd(), healthCmd(), outboxCmd(), doctorCmd(), chaosCmd(), timelineCmd(),
		incidentsCmd(), deadletterCmd(), repairCmd(), redriveCmd(), natsAuthCmd(), streamsCmd(), tripsCmd())
	return root
}
