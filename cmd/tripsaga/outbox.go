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
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/process"
)

// outboxServices are the services with an outbox; each keeps it in the
// PostgreSQL schema of its name.
var outboxServices = []string{"trips", "hotel", "payment", "car"} //nolint:gochecknoglobals // constant list

// outboxServicesOn returns outboxServices and the service of each optional
// step this process's STEPS turns on ("insurance").
func outboxServicesOn() []string {
	all := slices.Clone(outboxServices)
	for _, st := range stepsWhileBuilding().Saga() {
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
		Short: "List and re-drive outbox events that could not be published (quarantined, or waiting out an outage); verify that published ones are still in their streams",
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
			if total > 0 {
				fmt.Fprintf(w, "%d events re-driven; each service's relay publishes them now\n", total)
			} else if len(ids) == 0 {
				fmt.Fprintln(w, "nothing quarantined: nothing to re-drive")
			}
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

	var since time.Duration
	var verifyJSON bool
	verify := &cobra.Command{
		Use:   "verify",
		Short: "Check that every published event still kept in an outbox is in its stream, and publish again (same Nats-Msg-Id) those the stream lost",
		Long: `verify reads back, by the stream and sequence its PubAck gave, every event
the chosen services' outboxes published within --since (at most the outbox
retention, 24 h), as each relay's background check does every 10 s for a
part of them. An event its stream no longer holds (a message deleted, a
stream purged, deleted or restored from an older snapshot, a NATS host that
lost what it had not synced) is put back in line: the service's relay
publishes it again with its event id as Nats-Msg-Id once the stream's
duplicate window (2 min) has passed since its first publish, and consumers'
inboxes drop what they had handled. It exits 1 when it found any.

It needs DATABASE_URL and NATS_URL (the administrator's and the operator
identity's, as up.env has them), or --dir of a running tripsaga up.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if since <= 0 {
				return fmt.Errorf("--since %s: must be positive", since)
			}
			env, err := envForTool(dir, "DATABASE_URL", "NATS_URL")
			if err != nil {
				return fmt.Errorf("outbox verify: %w", err)
			}
			nc, err := process.ConnectNATS(env, natsauth.Admin, nats.Name("tripsaga-outbox-verify"), nats.Timeout(5*time.Second))
			if err != nil {
				return fmt.Errorf("outbox verify: %w", err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return fmt.Errorf("outbox verify: jetstream: %w", err)
			}
			type verified struct {
				Service string `json:"service"`
				outbox.VerifyReport
			}
			var out []verified
			_, err = eachOutbox(cmd.Context(), dir, services, func(ctx context.Context, pool *pgxpool.Pool) ([]outbox.Row, error) {
				rep, err := outbox.Verify(ctx, pool, js, outbox.VerifyOptions{Since: time.Now().Add(-since), ReadBack: -1})
				if rep.Lost == nil {
					rep.Lost = []outbox.Lost{}
				}
				out = append(out, verified{Service: pool.Config().ConnConfig.RuntimeParams["search_path"], VerifyReport: rep})
				return nil, err
			})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			lost := 0
			for _, v := range out {
				lost += len(v.Lost)
			}
			if verifyJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				if err := enc.Encode(out); err != nil {
					return err
				}
			} else {
				for _, v := range out {
					fmt.Fprintf(w, "%-8s %d events read back, %d outside their stream's sequences, %d lost\n", v.Service, v.ReadBack, v.Suspects, len(v.Lost))
					for _, l := range v.Lost {
						fmt.Fprintf(w, "  lost  %s  %s seq %d (%s); published again from %s\n", l.EventID, l.Stream, l.Seq, l.Why, l.Due.Format(time.RFC3339))
					}
				}
			}
			if lost > 0 {
				return fmt.Errorf("outbox verify: %d published events were lost by their streams; each is published again once its duplicate window has passed (watch `tripsaga outbox list --waiting`)", lost)
			}
			return nil
		},
	}
	verify.Flags().DurationVar(&since, "since", outbox.RelayRetentionDefault, "check the events published this long ago or later (the outbox keeps 24 h)")
	verify.Flags().BoolVar(&verifyJSON, "json", false, "print one JSON array, a report per service")

	cmd.AddCommand(list, redrive, verify)
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
