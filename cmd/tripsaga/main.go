// Command tripsaga runs the trip saga: one service process (serve), the
// whole system on a laptop (up), the demo of every failure situation
// (demo), the whole system under random faults and kills, audited
// (chaos), a projection rebuilt from the streams (replay), a throughput
// measurement (bench), or a health check of a running process (health).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := rootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "tripsaga:", err)
		os.Exit(1)
	}
}

// rootCmd returns the tripsaga command with every subcommand.
func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "tripsaga",
		Short:         "A choreographed saga: hotel, payment and car, undone if anything fails",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), upCmd(), demoCmd(), replayCmd(), benchCmd(), healthCmd(), outboxCmd(), doctorCmd(), chaosCmd(), timelineCmd(),
		incidentsCmd(), deadletterCmd(), repairCmd(), natsAuthCmd(), streamsCmd())
	return root
}
