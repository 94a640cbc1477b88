package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/chaos"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/natsauth"
)

// chaosOptions are the flags of tripsaga chaos.
type chaosOptions struct {
	duration, killEvery, settleLimit time.Duration
	dupWindow                        time.Duration // --duplicate-window
	rate                             float64
	replicas, natsCluster            int
	seed                             uint64
	dir                              string
	asJSON                           bool
	faults                           string
	steps                            string
	pgHA                             bool
	binary                           string // tests: the tripsaga binary to start
}

func chaosCmd() *cobra.Command {
	var o chaosOptions
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Run everything under random company faults and SIGKILLs for a while, then audit every trip against the companies' records",
		Long: `chaos starts the whole system (as up does, with --replicas and --nats-cluster)
and for --duration books trips at --rate per second through the trips API,
spread over every trips replica (a POST whose replica died is sent again
with the same Idempotency-Key to another), with a mix of travelers some of
whom are turned down on purpose (car or hotel sold out, card declined).
Meanwhile the company simulators draw faults per call (lost answers, hangs,
late commits, 503s, slow answers, failing and slow undos), and every
--kill-every one disruption of a kind drawn from --faults is carried out:

  kill         a random instance (any service replica, or a NATS node of a
               cluster; never the simulators) is SIGKILLed and restarted by
               the supervisor
  step-down    the JetStream leader of a random event stream, or of one of
               its consumers, steps down (a cluster only)
  empty-store  a NATS node is SIGKILLed and restarted with an empty store,
               as after a lost disk (a cluster only)
  lose-acked   one of the newest events of a random event stream, already
               acknowledged to its relay, is deleted from the stream, as a
               power loss before the server's fsync loses it; the outbox's
               check must publish it again, and the audit looks for each
               one by its Nats-Msg-Id
  partition    one random service replica's network is cut for 2 to 12 s,
               then healed: blackholed from PostgreSQL, its PostgreSQL
               connections reset, blackholed from NATS, or from both (each
               replica reaches PostgreSQL and NATS through TCP proxies of
               its own); it fences itself and a peer takes its leases. The
               report counts each shape, the fences and the leases taken
               over while cut (--replicas 2 or more)
  pg-failover  the primary of the PostgreSQL pair is SIGKILLed (keeper and
               postmaster); pg_auto_failover's monitor promotes the standby,
               the services find it through their multi-host DATABASE_URL,
               and the old primary is run again and rejoins as the new
               primary's standby before the next disruption; the report
               lists each failover with its time until writable (--pg-ha
               only)

--pg-ha runs PostgreSQL as a pg_auto_failover pair (a monitor, a primary and
its synchronous standby; needs pg_autoctl, from Debian's
postgresql-15-auto-failover) instead of one private cluster, as
"tripsaga up --pg-ha" does.

(--faults all: every kind the NATS setup, the replicas and --pg-ha allow.)
An event lost by its stream is published again only once the stream's
duplicate window has passed (the server remembers its Nats-Msg-Id until then); a shorter
--duplicate-window (STREAM_DUPLICATE_WINDOW_MS of every process) shortens
that wait, and so the run.

--steps (or STEPS) sets the saga's steps: with hotel,insurance,payment,car
the insurer's calls draw faults too, some travelers are refused by the
insurer, and each trip's policy is audited from the insurer's records (active
on a confirmed trip, none in force on a canceled one).

Then the faults and kills stop, the system is left to settle (every trip
confirmed or canceled, no step unfinished, at most --settle-limit), and
every trip is audited against the companies' own records. It prints trips
booked, whole / empty / HALF, duplicate effects per company, mails per
trip, the time to settle after the faults stopped, incidents, dead letters,
faults drawn and kills per instance (--json: one JSON object), and exits
non-zero on any half trip, any duplicate, any trip not settled, or a trip
without exactly one mail.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runChaos(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.duration, "duration", 2*time.Minute, "how long to book trips under faults and kills")
	f.Float64Var(&o.rate, "rate", 5, "trips booked per second, steadily")
	f.IntVar(&o.replicas, "replicas", 1, "processes of every service")
	f.IntVar(&o.natsCluster, "nats-cluster", 0, "0: one embedded NATS server; 3: a three-node JetStream cluster (its nodes are killed too)")
	f.DurationVar(&o.killEvery, "kill-every", 5*time.Second, "SIGKILL a random instance this often (0: never)")
	f.Uint64Var(&o.seed, "seed", 0, "seed of the travelers' mix and the kills' victims (0: from the clock; the report says which)")
	f.DurationVar(&o.settleLimit, "settle-limit", 10*time.Minute, "longest wait for the system to settle after the faults stopped")
	f.StringVar(&o.dir, "dir", "", "folder for the stack's data and logs, kept (default: a new temp folder, removed unless the run fails)")
	f.BoolVar(&o.asJSON, "json", false, "print the report as one JSON object")
	f.DurationVar(&o.dupWindow, "duplicate-window", events.DuplicateWindow, "the event streams' duplicate window (STREAM_DUPLICATE_WINDOW_MS of every process), at least 60s")
	f.StringVar(&o.steps, "steps", "", "the saga's steps, as STEPS (e.g. hotel,insurance,payment,car: the insurer is faulted and audited too); default: STEPS, else hotel,payment,car")
	f.StringVar(&o.faults, "faults", chaos.DisruptKill, "disruptions drawn every --kill-every, comma-separated: kill, step-down, empty-store, lose-acked, partition, pg-failover (with --pg-ha), or all")
	f.BoolVar(&o.pgHA, "pg-ha", false, "run PostgreSQL as a pg_auto_failover pair (monitor, primary, synchronous standby; needs pg_autoctl from postgresql-15-auto-failover), as up --pg-ha does")
	return cmd
}

func runChaos(ctx context.Context, out, errw io.Writer, o chaosOptions) error {
	switch {
	case o.duration <= 0:
		return fmt.Errorf("--duration %s: want a positive duration", o.duration)
	case o.rate <= 0:
		return fmt.Errorf("--rate %g: want more than 0 trips per second", o.rate)
	case o.replicas < 1:
		return fmt.Errorf("--replicas %d: want 1 or more", o.replicas)
	case o.natsCluster < 0 || o.natsCluster == 2:
		return fmt.Errorf("--nats-cluster %d: want 0 (one embedded server) or 3 or more", o.natsCluster)
	case o.killEvery < 0:
		return fmt.Errorf("--kill-every %s: want 0 (no kills) or a positive duration", o.killEvery)
	case o.dupWindow < events.MinDuplicateWindow || o.dupWindow > events.MaxAge:
		return fmt.Errorf("--duplicate-window %s: want from %s to %s", o.dupWindow, events.MinDuplicateWindow, events.MaxAge)
	}
	disruptions, err := chaos.ParseFaults(o.faults, o.natsCluster, o.replicas, o.pgHA)
	if err != nil {
		return err
	}
	steps := o.steps
	if steps == "" {
		steps = os.Getenv(events.StepsVar)
	}
	if _, err := events.ParseSteps(steps); err != nil {
		return fmt.Errorf("--steps %q: %w", steps, err)
	}
	var env []string
	if steps != "" {
		env = append(env, events.StepsVar+"="+steps)
	}
	dir, temp := o.dir, o.dir == ""
	if temp {
		d, err := os.MkdirTemp("", "tripsaga-chaos-")
		if err != nil {
			return err
		}
		dir = d
	} else if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	fmt.Fprintf(errw, "starting NATS, PostgreSQL, the simulators and every service (%d replica(s)) in %s ...\n", o.replicas, dir)
	start := time.Now()
	if o.pgHA {
		if err := needAutoFailover(); err != nil {
			return err
		}
	}
	if o.dupWindow != events.DuplicateWindow {
		env = append(env, fmt.Sprintf("%s=%d", events.DuplicateWindowEnv, o.dupWindow.Milliseconds()))
	}
	s, err := stack.Start(ctx, stack.Config{Dir: dir, Binary: o.binary, Replicas: o.replicas, NATSCluster: o.natsCluster, PGHA: o.pgHA, Env: env, Logger: chaosLogger(errw),
		Partitions: slices.Contains(disruptions, chaos.DisruptPartition)})
	if err != nil {
		if temp {
			_ = os.RemoveAll(dir)
		}
		return err
	}
	fmt.Fprintf(errw, "up in %s: %d instances; booking for %s at %g trips/s\n", time.Since(start).Round(time.Millisecond), len(s.Instances()), o.duration, o.rate)
	killEvery := o.killEvery
	if killEvery == 0 {
		killEvery = -1
	}
	rep, err := chaos.Run(ctx, s, chaos.Config{
		Duration: o.duration, Rate: o.rate, KillEvery: killEvery, Seed: o.seed, SettleLimit: o.settleLimit, Disruptions: disruptions,
		NATSURL: s.NATSURL, NATSCreds: s.Creds(natsauth.Admin), Replicas: o.replicas, NATSCluster: o.natsCluster, Steps: steps, PGHA: o.pgHA, Progress: errw, ProgressPlain: !isTerminal(errw),
	})
	s.Stop()
	if err != nil {
		fmt.Fprintf(errw, "logs in %s\n", dir)
		return err
	}
	if o.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.Print(out)
	}
	if err := rep.Err(); err != nil {
		fmt.Fprintf(errw, "logs and data kept in %s\n", dir)
		return err
	}
	if temp {
		if err := os.RemoveAll(dir); err != nil {
			return errors.Join(errors.New("chaos passed, but its folder could not be removed"), err)
		}
	}
	return nil
}

// isTerminal reports whether w is a terminal (the progress bar redraws
// itself there; elsewhere a plain line every 10 s).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// chaosLogger is the supervisor's logger in a chaos run: errors only (the
// run's own kills and restarts are expected; the report counts them).
func chaosLogger(errw io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(errw, &slog.HandlerOptions{Level: slog.LevelError}))
}
