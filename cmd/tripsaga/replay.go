package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/replay"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/reconciler"
	"github.com/tripsaga/tripsaga/saga"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// projections are what `tripsaga replay` can rebuild, by name, with what
// each holds.
var projections = []struct{ name, about string }{ //nolint:gochecknoglobals // read-only
	{reconciler.ProjectionName, "the reconciler's trip_view (the event kinds seen per trip), from the TRIPS, HOTEL, PAYMENT and CAR streams"},
}

// errUnknownProjection is returned for a name not in projections.
var errUnknownProjection = errors.New("no such projection")

func projectionList() string {
	var b strings.Builder
	for _, p := range projections {
		fmt.Fprintf(&b, "  %-11s %s\n", p.name, p.about)
	}
	return b.String()
}

func replayCmd() *cobra.Command {
	var asJSON bool
	var batch int
	var dir string
	var rf replayFlags
	cmd := &cobra.Command{
		Use:   "replay <consumer>",
		Short: "Re-drive a service's durable consumer from a point (--from-seq, --since), or rebuild a projection (\"tripsaga replay\" lists them); uses NATS_URL and DATABASE_URL, or the up running in --dir",
		Long: `Re-drive one service's durable consumer from a point of its streams, or
rebuild a projection. Without a name, list what can be replayed.

"tripsaga replay <consumer> --from-seq N" (or --since TIME, RFC 3339 or a
duration ago such as 10m) moves the durable consumer <consumer> (hotel,
payment, car, trips, reconciler) back to that point of each of its streams
(--stream S: one) with JetStream's consumer reset; the running service gets
every event from there again through its inbox, which drops the ones it
handled already, so no company sees a second effective call and no
projection counts an event twice. It waits until the consumer has
acknowledged them all again, with a progress bar, and prints events/s.
--from-seq N delivers exactly from N to the end, and the count printed is
what the consumer was given again; the replay is refused, with nothing
moved on any stream, when a stream no longer holds N (purged, aged out, or
made again), ends before N, or the consumer starts after N (JetStream
cannot reset a consumer below its start).
--trip T and --type K select events: only those are handed to the consumer,
each as an operator's redrive action on the OPERATOR stream (--operator,
--reason recorded), which the owning service carries out through the same
inbox. --dry-run prints what would be delivered (stream, sequence, time,
type, trip, id) and changes nothing.

"tripsaga replay reconciler --shadow" rebuilds the reconciler's view from
every stream into a shadow table (trip_view_shadow), prints where it
differs from the live view, and changes the live view only with --switch
(which then rebuilds it, as below, under its locks).

` + projectionList() + `
"tripsaga replay reconciler" (no point given) clears the reconciler's trip_view and its inbox
rows, then reads the TRIPS, HOTEL, PAYMENT and CAR streams from sequence 1
with new ordered consumers and applies every event again. It is safe while
"tripsaga serve reconciler" runs: advisory locks keep the live projection
from straddling the clear and pause its sweeps until the replay ends, and
both write the same inbox rows, so no event counts twice.

It reaches NATS and PostgreSQL by NATS_URL and DATABASE_URL, or, with
--dir D, through the "tripsaga up --dir D" running there (D/up.env); with
neither, through an up running in the default folder .tripsaga.`,
		Args: cobra.MaximumNArgs(1),
		// Read when completing, not when the command is built: a bad
		// STEPS is refused by the root's check, and --help still works.
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return replay.Consumers(events.Selected()), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			if len(args) == 0 {
				fmt.Fprintf(w, "consumers that can be re-driven from a point (tripsaga replay <consumer> --from-seq N | --since T):\n  %s\n",
					strings.Join(replay.Consumers(events.Selected()), ", "))
				fmt.Fprintf(w, "projections that can be replayed (tripsaga replay <name>):\n%s", projectionList())
				return nil
			}
			if batch < 1 {
				return fmt.Errorf("--batch %d: want at least 1 event per transaction", batch)
			}
			name := args[0]
			if cmd.Flags().Changed("from-seq") && rf.fromSeq == 0 {
				return fmt.Errorf("--from-seq 0: a stream's sequences start at 1 (give 1 to re-drive %s from the stream's start)", name)
			}
			if rf.consumerReplay() {
				return runConsumerReplay(cmd, dir, name, rf, asJSON)
			}
			if rf.shadow || rf.switchTo {
				return runShadowReplay(cmd, dir, name, rf, asJSON)
			}
			if name != reconciler.ProjectionName {
				return fmt.Errorf("replay %q: %w (to re-drive its consumer, give --from-seq or --since); these can be replayed:\n%s", name, errUnknownProjection, strings.TrimRight(projectionList(), "\n"))
			}
			p, log, err := openReplay(cmd, dir)
			if err != nil {
				return err
			}
			defer p.Close()
			var bar *progressbar.ProgressBar
			if rf.progress {
				bar = replay.NewBar(cmd.ErrOrStderr(), "replay "+name)
			}
			stats, err := reconciler.ReplayProjection(cmd.Context(), name, reconciler.ReplayConfig{
				Pool: p.Pool, JetStream: p.JS, Catalogue: p.Env.Steps(), BatchSize: batch, Logger: log,
				// What the live projection parks, the rebuild leaves out.
				Origin: saga.TripsOrigin(p.JS),
				Progress: func(n int) {
					if bar != nil {
						_ = bar.Add(n)
					}
				},
			})
			if bar != nil {
				_ = bar.Finish()
			}
			if err != nil {
				return fmt.Errorf("replay %s: %w", name, err)
			}
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(stats)
			}
			printReplay(w, name, stats)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the stats as JSON")
	cmd.Flags().IntVar(&batch, "batch", reconciler.ReplayBatchSizeDefault, "events applied per transaction")
	cmd.Flags().StringVar(&dir, "dir", "", "`folder` of a running tripsaga up (its up.env) to use instead of NATS_URL and DATABASE_URL")
	rf.register(cmd)
	return cmd
}

func printReplay(w io.Writer, name string, stats reconciler.ReplayStats) {
	fmt.Fprintf(w, "replayed %s: %d events read (%d applied, %d duplicates, %d skipped) into %d trips in %s (%.0f events/s)\n",
		name, stats.Events, stats.Applied, stats.Duplicates, stats.Skipped, stats.Trips,
		stats.Duration.Round(1e6), stats.EventsPerSecond())
	if stats.NoOrigin > 0 {
		fmt.Fprintf(w, "  of the skipped, %d triggers no trip.requested backs (the live view parked them)\n", stats.NoOrigin)
	}
	for _, s := range []string{"TRIPS", "HOTEL", "PAYMENT", "CAR"} {
		fmt.Fprintf(w, "  %-8s %d events\n", s, stats.PerStream[s])
	}
}

// openReplay opens the process a replay runs as (the reconciler's schema,
// migrated; NATS and PostgreSQL from the environment or the up running in
// dir) and its logger, which says only what goes wrong: the result is
// printed once at the end.
func openReplay(cmd *cobra.Command, dir string) (*process.Process, *slog.Logger, error) {
	env, err := envForTool(dir, "NATS_URL", "DATABASE_URL")
	if err != nil {
		return nil, nil, fmt.Errorf("replay: %w", err)
	}
	p, err := process.Open(cmd.Context(), "replay", reconciler.Schema, env, true, tripsql.SetSaga, tripsql.SetReconciler)
	if err != nil {
		return nil, nil, fmt.Errorf("replay: %w", err)
	}
	return p, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn})).With("service", "replay"), nil
}
