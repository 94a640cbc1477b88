package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/internal/stack"
)

func upCmd() *cobra.Command {
	var dir string
	var basePort int
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start everything on this machine: embedded NATS, a private PostgreSQL, the simulators and every service; Ctrl-C stops it all",
		RunE: func(cmd *cobra.Command, _ []string) error {
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			fmt.Fprintf(cmd.OutOrStdout(), "starting in %s ...\n", abs)
			s, err := stack.Start(cmd.Context(), stack.Config{
				Dir: abs, BasePort: basePort, Durable: true, DatabaseURL: os.Getenv("DATABASE_URL"), Logger: log,
			})
			if err != nil {
				return err
			}
			defer s.Stop()
			printStack(cmd, s)
			fmt.Fprintln(cmd.OutOrStdout(), "\nCtrl-C stops everything.")
			<-cmd.Context().Done()
			fmt.Fprintln(cmd.OutOrStdout(), "stopping ...")
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".tripsaga", "folder for NATS and PostgreSQL data and the logs")
	cmd.Flags().IntVar(&basePort, "port", 7400, "NATS listens here, the processes on the next ports (0 = any free ports)")
	return cmd
}

func printStack(cmd *cobra.Command, s *stack.Stack) {
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "NATS (JetStream)  %s\n", s.NATSURL)
	fmt.Fprintf(w, "PostgreSQL        %s\n", s.DatabaseURL)
	for _, name := range stack.Processes {
		fmt.Fprintf(w, "%-17s %-28s log %s\n", name, s.URL(name), s.LogPath(name))
	}
	urls := s.CompanyURLs()
	var parts []string
	for _, k := range []string{"HOTEL_URL", "PAYMENTS_URL", "CARS_URL", "MAIL_URL"} {
		parts = append(parts, k+"="+urls[k])
	}
	fmt.Fprintf(w, "companies         %s\n", strings.Join(parts, " "))
	fmt.Fprintf(w, "\nbook a trip:\n  curl -s -XPOST %s/trips -H 'Prefer: wait=10' -d '{\"traveler\":{\"name\":\"Ada Example\",\"email\":\"ada@example.com\"},\"hotel\":{\"property_id\":\"P-100\",\"check_in\":\"2026-12-18\",\"nights\":2},\"car\":{\"car_class\":\"compact\",\"pickup\":\"2026-12-18\",\"return\":\"2026-12-20\"},\"payment\":{\"card_token\":\"tok_visa_ok\",\"amount_cents\":33000,\"currency\":\"USD\"}}'\n", s.URL("trips"))
}
