package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/outbox"
)

// outboxServices are the services with an outbox; each keeps it in the
// PostgreSQL schema of its name.
var outboxServices = []string{"trips", "hotel", "payment", "car"} //nolint:gochecknoglobals // constant list

// outboxServicesOn returns outboxServices and the service of each optional
// step this process's STEPS turns on ("insurance").
func outboxServicesOn() []string {
	all := slices.Clone(outboxServices)
	for _, st := range events.Selected().Saga() {
		if !slices.Contains(all, st.Service) {
			all = append(all, st.Service)
		}
	}
	return all
}

func outboxCmd() *cobra.Command {
	var dir string
	var services []string
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "List and re-drive outbox events that could not be published (quarantined, or waiting out an outage)",
		Long: `Every service writes the events it publishes to its outbox table in the
same transaction as its state change; its relay publishes them to JetStream.

A relay retries an event the server refused for what it is (too large, bad
headers) with backoff and quarantines it after 50 refusals; it retries an
event that failed for the server's state (no storage left, a stream limit,
no stream for the subject, no leader, no PubAck in time, no connection) for
as long as that lasts, and never quarantines it.

"tripsaga outbox list" shows quarantined events (and, with --waiting, the
events waiting after a failure) with their cause and last error.
"tripsaga outbox redrive" puts quarantined events back in line once the
cause is fixed; the relay publishes each once more (its event id is the
Nats-Msg-Id, so JetStream keeps one copy).

Both reach PostgreSQL by DATABASE_URL, or, with --dir D, through the
"tripsaga up --dir D" running there; with neither, through an up running in
the default folder .tripsaga. They read every service's schema, so the URL
is the administrator's (up.env's), not a service's role, which may read its
own schema only.`,
	}
	cmd.PersistentFlags().StringVar(&dir, "dir", "", "`folder` of a running tripsaga up to use instead of DATABASE_URL")
	known := outboxServicesOn()
	cmd.PersistentFlags().StringSliceVar(&services, "service", known, "services whose outbox to use: "+strings.Join(known, ", "))

	var asJSON, waiting bool
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List quarantined outbox events (with --waiting, also those waiting after a failed publish)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 {
				return fmt.Errorf("--limit %d: must be at least 1", limit)
			}
			rows, err := eachOutbox(cmd.Context(), dir, services, func(ctx context.Context, pool *pgxpool.Pool) ([]outbox.Row, error) {
				return outbox.List(ctx, pool, waiting, limit)
			})
			if err != nil {
				return err
			}
			return printOutboxRows(cmd.OutOrStdout(), rows, asJSON, waiting)
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print one JSON array")
	list.Flags().BoolVar(&waiting, "waiting", false, "also list events waiting after a failed publish (outages, refusals not yet quarantined)")
	list.Flags().IntVar(&limit, "limit", 1000, "at most this many events per service")

	var all, redriveJSON bool
	redrive := &cobra.Command{
		Use:   "redrive [event-id...]",
		Short: "Put quarantined outbox events back in line (the named ones, or --all); the relay publishes each once",
		RunE: func(cmd *cobra.Command, ids []string) error {
			if len(ids) == 0 && !all {
				return errors.New("name the event ids to re-drive (see `tripsaga outbox list`), or pass --all")
			}
			if len(ids) > 0 && all {
				return errors.New("give event ids or --all, not both")
			}
			type redriven struct {
				Service string   `json:"service"`
				Events  []string `json:"event_ids"`
			}
			var out []redriven
			_, err := eachOutbox(cmd.Context(), dir, services, func(ctx context.Context, pool *pgxpool.Pool) ([]outbox.Row, error) {
				got, err := outbox.Redrive(ctx, pool, ids)
				if err != nil {
					return nil, err
				}
				out = append(out, redriven{Service: pool.Config().ConnConfig.RuntimeParams["search_path"], Events: got})
				return nil, nil
			})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if redriveJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			total := 0
			done := map[string]bool{}
			for _, r := range out {
				total += len(r.Events)
				for _, id := range r.Events {
					done[id] = true
					fmt.Fprintf(w, "re-driven  %-8s %s\n", r.Service, id)
				}
			}
			fmt.Fprintf(w, "%d events re-driven; each service's relay publishes them now\n", total)
			var missing []string
			for _, id := range ids {
				if !done[id] {
					missing = append(missing, id)
				}
			}
			if len(missing) > 0 {
				return fmt.Errorf("not quarantined in the outbox of %s (unknown, already published, or waiting out an outage; see `tripsaga outbox list --waiting`): %s",
					strings.Join(services, ", "), strings.Join(missing, ", "))
			}
			return nil
		},
	}
	redrive.Flags().BoolVar(&all, "all", false, "re-drive every quarantined event of the chosen services")
	redrive.Flags().BoolVar(&redriveJSON, "json", false, "print what was re-driven as JSON")

	cmd.AddCommand(list, redrive)
	return cmd
}

// serviceRow is an outbox row with the service it belongs to.
type serviceRow struct {
	Service string `json:"service"`
	outbox.Row
}

// eachOutbox runs f on a pool of each service's schema, in the order given,
// and returns the rows it returned tagged with the service.
func eachOutbox(ctx context.Context, dir string, services []string, f func(context.Context, *pgxpool.Pool) ([]outbox.Row, error)) ([]serviceRow, error) {
	for _, s := range services {
		if known := outboxServicesOn(); !slices.Contains(known, s) {
			return nil, fmt.Errorf("--service %q: not a service with an outbox (%s)", s, strings.Join(known, ", "))
		}
	}
	env, err := envForTool(dir, "DATABASE_URL")
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	out := []serviceRow{}
	for _, s := range services {
		cfg, err := pgxpool.ParseConfig(env.DatabaseURL)
		if err != nil {
			return nil, fmt.Errorf("outbox: DATABASE_URL: %w", err)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = s
		cfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("outbox: %s: %w", s, err)
		}
		var exists bool
		err = pool.QueryRow(ctx, "SELECT to_regclass('outbox') IS NOT NULL").Scan(&exists)
		if err == nil && !exists {
			pool.Close()
			continue // that service never ran here
		}
		var rows []outbox.Row
		if err == nil {
			rows, err = f(ctx, pool)
		}
		pool.Close()
		if err != nil {
			return nil, fmt.Errorf("outbox: %s: %w", s, err)
		}
		for _, r := range rows {
			out = append(out, serviceRow{Service: s, Row: r})
		}
	}
	return out, nil
}

func printOutboxRows(w io.Writer, rows []serviceRow, asJSON, waiting bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	if len(rows) == 0 {
		if waiting {
			fmt.Fprintln(w, "no quarantined or waiting outbox events")
		} else {
			fmt.Fprintln(w, "no quarantined outbox events (events waiting after a failed publish: --waiting)")
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tEVENT ID\tSUBJECT\tSTATE\tCAUSE\tREFUSALS\tOUTAGES\tLAST FAILURE\tLAST ERROR")
	for _, r := range rows {
		state := "waiting"
		if r.Quarantined {
			state = "quarantined"
		}
		last := "-"
		if r.LastFailedAt != nil {
			last = r.LastFailedAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.Service, r.EventID, r.Subject, state, r.Cause, r.Attempts, r.Outages, last, oneLine(r.LastError, 100))
	}
	return tw.Flush()
}

// oneLine is s on one line, cut to at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
