package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/internal/stack"
)

func upCmd() *cobra.Command {
	var dir string
	var basePort int
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
(for a D in the temp folder, in the temp folder), linked from D/pg/data.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if n := len(stack.Processes); basePort != 0 && (basePort < 1024 || basePort > 65535-n) {
				return fmt.Errorf("--port %d: want 0 (any free ports) or 1024 to %d (NATS listens on it, the processes on the next %d ports)", basePort, 65535-n, n)
			}
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			fmt.Fprintf(cmd.OutOrStdout(), "starting in %s ...\n", abs)
			s, err := stack.Start(cmd.Context(), stack.Config{
				Dir: abs, BasePort: basePort, Durable: true, DatabaseURL: os.Getenv("DATABASE_URL"), Logger: log,
			})
			var inUse *stack.PortInUseError
			if errors.As(err, &inUse) {
				return fmt.Errorf("%w\nanother tripsaga up may be running: choose other ports with --port N (NATS listens on N, the processes on N+1 to N+%d), e.g. --port %d, or --port 0 for any free ports",
					err, len(stack.Processes), inUse.Port-inUse.Port%100+100)
			}
			if err != nil {
				return err
			}
			defer s.Stop()
			printStack(cmd, s, abs)
			fmt.Fprintln(cmd.OutOrStdout(), "\nCtrl-C stops everything.")
			<-cmd.Context().Done()
			fmt.Fprintln(cmd.OutOrStdout(), "stopping ...")
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", defaultUpDir, "folder for NATS and PostgreSQL data and the logs; one up at a time per folder")
	cmd.Flags().IntVar(&basePort, "port", 7400, "NATS listens here, the processes on the next ports (0 = any free ports)")
	return cmd
}

func printStack(cmd *cobra.Command, s *stack.Stack, dir string) {
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "NATS (JetStream)  %s\n", s.NATSURL)
	if os.Getenv("DATABASE_URL") != "" {
		fmt.Fprintf(w, "PostgreSQL        %s (DATABASE_URL from the environment: no private cluster)\n", s.DatabaseURL)
	} else {
		fmt.Fprintf(w, "PostgreSQL        %s\n", s.DatabaseURL)
	}
	if s.PostgresAdopted {
		fmt.Fprintf(w, "                  adopted: this PostgreSQL server was already running on %s, left by an earlier up that was killed\n                  without stopping it; this up uses it and stops it on Ctrl-C\n",
			filepath.Join(dir, "pg", "data"))
	}
	for _, name := range stack.Processes {
		fmt.Fprintf(w, "%-17s %-28s log %s\n", name, s.URL(name), s.LogPath(name))
	}
	env := s.Env()
	fmt.Fprintf(w, "\nenvironment (also in %s; or use --dir %s with tripsaga replay):\n", filepath.Join(dir, stack.EnvFile), dir)
	for _, k := range stack.EnvNames(env) {
		fmt.Fprintln(w, stack.ExportLine(k, env[k]))
	}
	day := time.Now().AddDate(0, 0, 30)
	in, back := day.Format(time.DateOnly), day.AddDate(0, 0, 2).Format(time.DateOnly)
	fmt.Fprintf(w, "\nbook a trip:\n  curl -s -XPOST %s/trips -H 'Prefer: wait=10' -d '{\"traveler\":{\"name\":\"Ada Example\",\"email\":\"ada@example.com\"},\"hotel\":{\"property_id\":\"P-100\",\"check_in\":\"%s\",\"nights\":2},\"car\":{\"car_class\":\"compact\",\"pickup\":\"%s\",\"return\":\"%s\"},\"payment\":{\"card_token\":\"tok_visa_ok\",\"amount_cents\":33000,\"currency\":\"USD\"}}'\n",
		s.URL("trips"), in, in, back)
}
