package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/internal/app"
	"github.com/tripsaga/tripsaga/reconciler"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func replayCmd() *cobra.Command {
	var asJSON bool
	var batch int
	cmd := &cobra.Command{
		Use:   "replay <projection>",
		Short: "Rebuild a projection from the event streams (only \"reconciler\"); configured by NATS_URL and DATABASE_URL",
		Long: `Rebuild a projection from the event streams.

"tripsaga replay reconciler" clears the reconciler's trip_view and its inbox
rows, then reads the TRIPS, HOTEL, PAYMENT and CAR streams from sequence 1
with new ordered consumers and applies every event again. It is safe while
"tripsaga serve reconciler" runs: advisory locks keep the live projection
from straddling the clear and pause its sweeps until the replay ends, and
both write the same inbox rows, so no event counts twice.`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{reconciler.ProjectionName},
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != reconciler.ProjectionName {
				return fmt.Errorf("%w: %q: only %q can be replayed", reconciler.ErrUnknownProjection, args[0], reconciler.ProjectionName)
			}
			env, err := app.EnvFromOS()
			if err != nil {
				return fmt.Errorf("replay: %w", err)
			}
			if err := env.Require("NATS_URL", "DATABASE_URL"); err != nil {
				return fmt.Errorf("replay: %w", err)
			}
			p, err := app.Open(cmd.Context(), "replay", reconciler.Schema, env, true, tripsql.SetSaga, tripsql.SetReconciler)
			if err != nil {
				return fmt.Errorf("replay: %w", err)
			}
			defer p.Close()
			stats, err := reconciler.ReplayProjection(cmd.Context(), args[0], reconciler.ReplayConfig{
				Pool: p.Pool, JetStream: p.JS, BatchSize: batch, Logger: p.Log,
			})
			if err != nil {
				return fmt.Errorf("replay %s: %w", args[0], err)
			}
			w := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(stats)
			}
			fmt.Fprintf(w, "replayed %s: %d events read (%d applied, %d duplicates, %d skipped) into %d trips in %s (%.0f events/s)\n",
				args[0], stats.Events, stats.Applied, stats.Duplicates, stats.Skipped, stats.Trips,
				stats.Duration.Round(1e6), stats.EventsPerSecond())
			for _, s := range []string{"TRIPS", "HOTEL", "PAYMENT", "CAR"} {
				fmt.Fprintf(w, "  %-8s %d events\n", s, stats.PerStream[s])
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the stats as JSON")
	cmd.Flags().IntVar(&batch, "batch", reconciler.ReplayBatchSizeDefault, "events applied per transaction")
	return cmd
}
