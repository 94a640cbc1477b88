// Command tripsaga runs the trip saga: one service process (serve), the
// whole system on a laptop (up), or the demo of every failure situation
// (demo).
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
	root := &cobra.Command{
		Use:           "tripsaga",
		Short:         "A choreographed saga: hotel, payment and car, undone if anything fails",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), upCmd(), demoCmd(), replayCmd(), benchCmd())
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "tripsaga:", err)
		os.Exit(1)
	}
}
