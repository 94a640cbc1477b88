package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/redact"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/reconciler"
)

func upCmd() *cobra.Command {
	var dir string
	var basePort, replicas, natsCluster int
	var pgHA bool
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start everything on this machine: embedded NATS, a private PostgreSQL, the simulators and every service; Ctrl-C stops it all",
		Long: `up starts the whole system on this machine and supervises it until Ctrl-C:
an embedded NATS server (JetStream data in D/nats), a private PostgreSQL
cluster (D/pg, made with the machine's initdb and pg_ctl), the company
simulators and every service as its own process (logs in D/logs). A
process that dies is started again, PostgreSQL and NATS included, and up
says so on stderr.

One up per folder: a second one on the same --dir is refused while the
first runs, whatever its --port. up prints every URL as export lines and
writes them to D/up.env; "tripsaga replay --dir D" finds them there.

If up itself is killed (SIGKILL), its services stop with it but the
PostgreSQL server keeps running; the next up in the folder adopts it, says
so, and stops it on Ctrl-C. Run as root, the PostgreSQL binaries run as the
postgres OS user; up never changes the modes of the folders above D: when
postgres cannot reach D/pg, the cluster lives in /var/lib/tripsaga/postgres
(for a D in the temp folder, in the temp folder), linked from D/pg/data.

--replicas N runs N processes of every service (hotel, payment, car, trips,
reconciler; the simulators stay one), sharing PostgreSQL and NATS: the
first keeps the process's name ("hotel"), the others are hotel-2,
hotel-3..., each with its own port and log (D/logs/hotel-2.log), restarted
on its own. Every child is told its name in TRIPSAGA_INSTANCE.

--nats-cluster 3 runs, instead of the embedded server, three NATS servers
with JetStream as child processes (tripsaga serve nats; nats-1, nats-2,
nats-3), clustered over loopback routes (cluster "tripsaga"), each with its
store in D/nats/n1..n3; a node that dies is restarted on the same ports and
store. NATS_URL is the comma-separated list of their client URLs, and the
streams are created with 3 replicas (STREAM_REPLICAS=3; a stream that has
fewer is raised to 3). up waits for the cluster's meta leader before it
starts the services.

Ports with --port B: NATS (nats-1 in a cluster) on B, sim hotel payment car
trips reconciler on B+1..B+6 as always; then the other replicas (hotel-2
payment-2 car-2 trips-2 reconciler-2, then -3...), then in a cluster the
client ports of nats-2 and nats-3, the route ports of nats-1..3 and their
health ports (GET /readyz). E.g. --port 7400 --replicas 2 --nats-cluster 3:
hotel-2..reconciler-2 on 7407-7411, nats-2 and nats-3 clients on 7412-7413,
routes on 7414-7416, health on 7417-7419.

--pg-ha runs PostgreSQL, instead of one private cluster, as a
pg_auto_failover pair in D/pg-ha: a monitor, a primary and its synchronous
standby (synchronous_standby_names 'ANY 1 (...)'), each run by its own
pg_autoctl keeper, with health checks shortened so that a dead primary is
replaced in seconds. It needs pg_autoctl, from Debian's
postgresql-15-auto-failover (apt-get install postgresql-15-auto-failover),
and refuses to start without it, or with DATABASE_URL set. Every service
gets a multi-host DATABASE_URL of both nodes with
target_session_attrs=read-write, so it writes to whichever node is primary
now. up prints the monitor's and both nodes' URLs and states, and runs a
keeper that died again at once (a node killed by hand mostly comes back
before the monitor fails it over; "tripsaga chaos --pg-ha --faults
pg-failover" makes real failovers). The pair trusts loopback connections:
for trying out, not for production.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if replicas < 1 {
				return fmt.Errorf("--replicas %d: want 1 or more", replicas)
			}
			if natsCluster < 1 || natsCluster == 2 {
				return fmt.Errorf("--nats-cluster %d: want 1 (one embedded server) or 3 or more (a JetStream cluster of two loses its quorum with either node)", natsCluster)
			}
			if pgHA {
				if os.Getenv("DATABASE_URL") != "" {
					return errors.New("--pg-ha runs its own PostgreSQL pair: unset DATABASE_URL, or leave out --pg-ha to use it")
				}
				if err := needAutoFailover(); err != nil {
					return err
				}
			}
			scfg := stack.Config{
				BasePort: basePort, Durable: true, DatabaseURL: os.Getenv("DATABASE_URL"),
				Replicas: replicas, NATSCluster: natsCluster, PGHA: pgHA,
			}
			generated := false
			if os.Getenv(reconciler.OperatorTokenEnv) == "" {
				// Without a token the reconciler refuses every action; one
				// of its own, in up.env (mode 0600), lets the tools act.
				tok := make([]byte, 16)
				if _, err := rand.Read(tok); err != nil {
					return fmt.Errorf("operators' token: %w", err)
				}
				scfg.Env = append(scfg.Env, reconciler.OperatorTokenEnv+"="+hex.EncodeToString(tok))
				generated = true
			}
			n := len(stack.Ports(scfg)) - 1
			if basePort != 0 && (basePort < 1024 || basePort > 65535-n) {
				return fmt.Errorf("--port %d: want 0 (any free ports) or 1024 to %d (NATS listens on it, the processes on the next %d ports)", basePort, 65535-n, n)
			}
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			fmt.Fprintf(cmd.OutOrStdout(), "starting in %s ...\n", abs)
			scfg.Dir, scfg.Logger = abs, log
			s, err := stack.Start(cmd.Context(), scfg)
			var inUse *stack.PortInUseError
			if errors.As(err, &inUse) {
				return fmt.Errorf("%w\nanother tripsaga up may be running: choose other ports with --port N (NATS listens on N, the processes on N+1 to N+%d), e.g. --port %d, or --port 0 for any free ports",
					err, n, inUse.Port-inUse.Port%100+100)
			}
			if err != nil {
				return err
			}
			defer s.Stop()
			printStack(cmd, s, abs)
			if generated {
				fmt.Fprintf(cmd.OutOrStdout(), "\noperators' token: made for this up (OPERATOR_TOKEN was not set), in %s; the tools' --dir reads it there\n", filepath.Join(abs, stack.EnvFile))
			}
			fmt.Fprintln(cmd.OutOrStdout(), "\nCtrl-C stops everything.")
			<-cmd.Context().Done()
			fmt.Fprintln(cmd.OutOrStdout(), "stopping ...")
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", defaultUpDir, "folder for NATS and PostgreSQL data and the logs; one up at a time per folder")
	cmd.Flags().IntVar(&basePort, "port", 7400, "NATS listens here, the processes on the next ports (0 = any free ports)")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "processes of every service (hotel, payment, car, trips, reconciler; the simulators stay one)")
	cmd.Flags().BoolVar(&pgHA, "pg-ha", false, "PostgreSQL as a pg_auto_failover pair (monitor, primary, synchronous standby) in D/pg-ha; needs pg_autoctl (apt-get install postgresql-15-auto-failover)")
	cmd.Flags().IntVar(&natsCluster, "nats-cluster", 1, "NATS servers: 1 = one embedded in up; 3 = a three-node JetStream cluster of child processes, streams at 3 replicas")
	return cmd
}

func printStack(cmd *cobra.Command, s *stack.Stack, dir string) {
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "NATS (JetStream)  %s\n", s.NATSURL)
	for _, name := range s.Instances() {
		if strings.HasPrefix(name, "nats-") {
			fmt.Fprintf(w, "%-17s %-28s log %s (cluster %s, stream replicas %d)\n", name, s.URL(name)+"/readyz", s.LogPath(name), stack.ClusterName, s.StreamReplicas())
		}
	}
	if ha := s.PGHA(); ha != nil {
		fmt.Fprintf(w, "PostgreSQL        %s (both nodes, the primary's found by target_session_attrs; the administrator; each service connects as its own role)\n", redact.URL(s.DatabaseURL))
		fmt.Fprintf(w, "  pg_auto_failover monitor  %s (log %s)\n", redact.URL(ha.MonitorURL), filepath.Join(dir, "pg-ha", "monitor.log"))
		for i, name := range pgcluster.HANodeNames {
			fmt.Fprintf(w, "  %-24s postgres://postgres@127.0.0.1:%d/postgres (data %s, log %s)\n", name, ha.NodePorts[i],
				filepath.Join(dir, "pg-ha", name), filepath.Join(dir, "pg-ha", name+".log"))
		}
		if st, err := ha.States(cmd.Context()); err == nil {
			for _, n := range st {
				fmt.Fprintf(w, "  %-24s is %s\n", n.Name, n.Reported)
			}
		}
	} else if os.Getenv("DATABASE_URL") != "" {
		fmt.Fprintf(w, "PostgreSQL        %s (DATABASE_URL from the environment: no private cluster)\n", redact.URL(s.DatabaseURL))
	} else {
		fmt.Fprintf(w, "PostgreSQL        %s (the administrator; each service connects as its own role)\n", redact.URL(s.DatabaseURL))
	}
	if s.PostgresAdopted {
		fmt.Fprintf(w, "                  adopted: this PostgreSQL server was already running on %s, left by an earlier up that was killed\n                  without stopping it; this up uses it and stops it on Ctrl-C\n",
			filepath.Join(dir, "pg", "data"))
	}
	for _, name := range s.Instances() {
		if strings.HasPrefix(name, "nats-") {
			continue
		}
		fmt.Fprintf(w, "%-17s %-28s log %s\n", name, s.URL(name), s.LogPath(name))
	}
	env := s.Env()
	// Passwords never reach stdout (it lands in CI logs and terminals'
	// scrollback): the lines show them masked, and up.env (mode 0600)
	// holds them.
	envFile := filepath.Join(dir, stack.EnvFile)
	fmt.Fprintf(w, "\nenvironment: . %s sets it (passwords masked here; or use --dir %s with the tools):\n", envFile, dir)
	for _, k := range stack.EnvNames(env) {
		v := redact.URL(env[k])
		if k == reconciler.OperatorTokenEnv {
			v = redact.Mask // a secret like a password: in up.env only
		}
		fmt.Fprintln(w, stack.ExportLine(k, v))
	}
	day := time.Now().AddDate(0, 0, 30)
	in, back := day.Format(time.DateOnly), day.AddDate(0, 0, 2).Format(time.DateOnly)
	fmt.Fprintf(w, "\nbook a trip:\n  curl -s -XPOST %s/trips -H 'Prefer: wait=10' -d '{\"traveler\":{\"name\":\"Ada Example\",\"email\":\"ada@example.com\"},\"hotel\":{\"property_id\":\"P-100\",\"check_in\":\"%s\",\"nights\":2},\"car\":{\"car_class\":\"compact\",\"pickup\":\"%s\",\"return\":\"%s\"},\"payment\":{\"card_token\":\"tok_visa_ok\",\"amount_cents\":33000,\"currency\":\"USD\"}}'\n",
		s.URL("trips"), in, in, back)
}

// needAutoFailover refuses --pg-ha, naming the package, when pg_autoctl
// (pg_auto_failover) is not on PATH.
func needAutoFailover() error {
	if _, err := exec.LookPath("pg_autoctl"); err != nil {
		return errors.New("--pg-ha needs pg_autoctl (pg_auto_failover), which is not on PATH: install Debian's postgresql-15-auto-failover (apt-get install -y postgresql-15-auto-failover)")
	}
	return nil
}
