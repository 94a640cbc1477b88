package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/tripsaga/tripsaga/internal/bench"
)

func benchCmd() *cobra.Command {
	var cfg bench.Config
	var asJSON bool
	var plotDir, dir, saveJSON string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the whole system and this machine's limits in one run: trips/s, answer ms, per-trip costs, relay and rebuild events/s",
		Long: `bench starts a durable private PostgreSQL (fsync and synchronous_commit on,
pg_stat_statements loaded) and the whole system on it, as up does, and in
that one run measures:

  baseline A  saga-step transactions/s on that cluster (inbox insert, row
              update, outbox insert, commit; 16 connections, --baseline-a-seconds)
  baseline B  JetStream async publishes/s of 512 B on the system's NATS server
              (--baseline-b-seconds)
  warm-up     a tenth of --trips (5 to 100), not measured but checked
  closed loop --trips trips from each --concurrency value of clients; the best
              is the maximum trips/s, valid only when every trip is confirmed
              and nothing is left pending after the run
  open loop   trips sent at each --open share (%) of that maximum for
              --open-seconds, with p50/p95/p99 answer ms and the rate achieved
  per trip    PostgreSQL transactions and statements (pg_stat_statements) and
              CPU ms of every process, PostgreSQL and NATS (/proc/<pid>/stat),
              and the reconciler's lag
  relay       outbox relay events/s draining --relay-events, and with writers
  rebuild     reconciler rebuild events/s from --rebuild-events and twice that
  scaling     with --replicas 1,2,4 (and --nats-nodes 1,3), the system started
              afresh for each point, the same cluster: trips/s, answer ms and
              CPU per trip against the replicas of every service and the NATS
              servers
  peer        with --peer dbos, then the same trip saga written with DBOS
              Transact for Go (bench/peers/dbos, built with go build), alone
              on the same cluster, at the same client counts: trips/s,
              answer ms, CPU and PostgreSQL per trip beside ours, and every
              peer trip audited against the companies' records

Every figure is also printed as a ratio to the baselines of the same run.
With --trips-url it books trips on a running system and measures the trip
runs only. The answer time is the time to the answer of POST /trips with
Prefer: wait=60.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("trips-url") {
				u, err := bench.CheckURL("--trips-url", cfg.TripsURL)
				if err != nil {
					return err
				}
				cfg.TripsURL = u
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			ctx := cmd.Context()
			cfg.Progress = progressWriter(cmd.ErrOrStderr())
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelInfo}))
			if cfg.TripsURL == "" {
				if dir == "" {
					d, err := os.MkdirTemp("", "tripsaga-bench-")
					if err != nil {
						return fmt.Errorf("bench: %w", err)
					}
					defer os.RemoveAll(d)
					dir = d
				}
				cfg.Dir = dir
			}
			rep, err := bench.Run(ctx, cfg)
			if rep == nil {
				return err
			}
			if plotDir != "" {
				files, perr := rep.Plot(plotDir)
				if perr != nil {
					return errors.Join(err, perr)
				}
				for _, f := range files {
					fmt.Fprintln(cmd.ErrOrStderr(), "wrote", f)
				}
			}
			if saveJSON != "" {
				b, jerr := json.MarshalIndent(rep, "", "  ")
				if jerr == nil {
					jerr = os.WriteFile(saveJSON, append(b, '\n'), 0o644)
				}
				if jerr != nil {
					return errors.Join(err, fmt.Errorf("bench: --save: %w", jerr))
				}
			}
			w := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				if jerr := enc.Encode(rep); jerr != nil {
					return errors.Join(err, jerr)
				}
			} else if werr := rep.WriteText(w); werr != nil {
				return errors.Join(err, werr)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Trips, "trips", 2000, "trips booked by each closed loop")
	f.IntSliceVar(&cfg.Concurrency, "concurrency", []int{16, 32, 64}, "clients booking at once; each value runs one closed loop and the best is the maximum")
	f.IntSliceVar(&cfg.OpenPercents, "open", []int{25, 50, 80}, "open loops, each offered at this share (%) of the maximum trips/s")
	f.Float64Var(&cfg.OpenSeconds, "open-seconds", 10, "how long each open loop sends trips, s (0: no open loops)")
	f.Float64Var(&cfg.BaselineASeconds, "baseline-a-seconds", 10, "how long baseline A (saga-step transactions) runs, s")
	f.Float64Var(&cfg.BaselineBSeconds, "baseline-b-seconds", 5, "how long baseline B (JetStream publishes) runs, s")
	f.IntVar(&cfg.RelayEvents, "relay-events", 100000, "outbox backlog the relay drains, events")
	f.IntVar(&cfg.RebuildEvents, "rebuild-events", 100000, "events of the smaller reconciler rebuild (the other has twice as many)")
	f.BoolVar(&cfg.SimMemory, "sim-memory", true, "run the company simulators with their records in memory (serve sim --memory), so PostgreSQL works only for the system under test")
	f.StringVar(&cfg.TripsURL, "trips-url", "", "trips API of a running system, e.g. http://127.0.0.1:7405 (default: start one and measure everything)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object instead of tables")
	f.StringVar(&saveJSON, "save", "", "also write the JSON object into this file")
	f.StringVar(&plotDir, "plot", "", "write PNG charts (answer time against offered rate, throughput and answer time over the run) into this folder")
	f.StringVar(&cfg.Peer, "peer", "", "also measure a peer in the same run, after our figures, at the same --concurrency and --trips, and print both side by side: dbos (bench/peers/dbos, DBOS Transact for Go; needs Go to build it)")
	f.IntSliceVar(&cfg.Replicas, "replicas", nil, "also measure the scaling curve: the system started afresh with this many replicas of every service, one point per value (e.g. 1,2,4), at the best closed loop's clients, with an open loop at half each point's trips/s")
	f.IntSliceVar(&cfg.NATSNodes, "nats-nodes", []int{1}, "with --replicas, the NATS servers of each point: 1 (one embedded server) and/or 3 (a JetStream cluster, streams replicated 3 times)")
	f.StringVar(&cfg.PeerDir, "peer-dir", "", "the peer's module folder (default: bench/peers/<peer> in the working folder or above it)")
	f.StringVar(&dir, "dir", "", "folder for the cluster, NATS stores and logs, kept afterwards (default: a temporary folder, removed)")
	cmd.AddCommand(benchStackCmd())
	return cmd
}

// benchStackCmd is the bench's stack process: the whole system with its
// embedded NATS server, apart from the bench's own process.
func benchStackCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:    "stack",
		Short:  "Run the whole system for bench on DATABASE_URL; print its addresses as JSON; stop at EOF on stdin",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			return bench.ServeStack(cmd.Context(), dir, cmd.InOrStdin(), cmd.OutOrStdout(), log)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "folder for NATS data and the logs")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

// progressWriter returns w when it is a terminal, and nil (no progress bar)
// otherwise: a bar redrawn into a file or pipe is a line per update.
func progressWriter(w io.Writer) io.Writer {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return w
}
