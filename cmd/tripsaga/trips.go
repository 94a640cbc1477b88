package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/reconciler"
)

// tripFilterFlags are the trip list's filters as flags, the same names
// and values as GET /api/trips' query parameters.
type tripFilterFlags struct {
	status, step, state, company, errorSub, paused, finding, version, minAge, from, to string
	minAttempts                                                                        int
}

func (f *tripFilterFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.status, "status", "", "the trip's status: pending, confirmed, canceling, canceled, ...")
	fl.StringVar(&f.step, "step", "", "the step the trip waits on (its unfinished step): hotel, payment, car, insurance, mail, ...")
	fl.StringVar(&f.state, "state", "", "that step's state: pending, started, unknown or compensating")
	fl.StringVar(&f.company, "company", "", "the service whose company that step calls: hotel, payment, car, ...")
	fl.IntVar(&f.minAttempts, "min-attempts", 0, "that step has made at least this many calls (its undo's while compensating)")
	fl.StringVar(&f.errorSub, "error", "", "a part of that step's last error (any case)")
	fl.StringVar(&f.paused, "paused", "", "true: an operator paused the trip's calls at that step's service (false: not paused)")
	fl.StringVar(&f.finding, "finding", "", "an open finding of the trip: half, orphan, stuck, open_undo, unattributed")
	fl.StringVar(&f.version, "version", "", `the trip's version (its saga order, "hotel,payment,car"; "default" for trips of before versions)`)
	fl.StringVar(&f.minAge, "min-age", "", "the trip's first event is at least this old, e.g. 10m")
	fl.StringVar(&f.from, "from", "", "the trip's first event at or after this time (RFC 3339)")
	fl.StringVar(&f.to, "to", "", "the trip's first event before this time (RFC 3339)")
}

// values returns the filters set, as query parameters.
func (f *tripFilterFlags) values() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"status": f.status, "step": f.step, "state": f.state, "company": f.company, "error": f.errorSub, "paused": f.paused,
		"finding": f.finding, "version": f.version, "min_age": f.minAge, "from": f.from, "to": f.to} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.minAttempts != 0 {
		q.Set("min_attempts", strconv.Itoa(f.minAttempts)) // a negative one is the reconciler's to refuse
	}
	return q
}

// object returns the filters set as the JSON object a bulk action takes.
func (f *tripFilterFlags) object() map[string]string {
	m := map[string]string{}
	for k, v := range f.values() {
		m[k] = v[0]
	}
	return m
}

func tripsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trips",
		Short: "Find trips by what is wrong with them and act on every trip a filter matches",
		Long: `"list" pages through the trips a filter matches (GET /api/trips on the
reconciler): by status, by the step a trip waits on and its state, its
company, attempts and last error (as the services' step logs said at the
last sweep), by open finding, version, age and time range.

"bulk" applies one operator action (retry_undo, pause, resume, resolve,
settle, or redrive --action-step S) to every trip a filter matches. Without --yes it is a dry run:
the count and a sample, nothing recorded. --yes N runs it if the filter
still matches exactly N trips (so the set cannot grow behind you), at
--rate actions per second per company, the first --canary trips first
(stopping if any failed), and follows its progress. "bulk-show" and
"bulk-cancel" show and cancel one.

The reconciler is found at RECONCILER_URL, or through the up running in
--dir (default .tripsaga); acting needs OPERATOR_TOKEN (up's by default).`,
	}
	cmd.AddCommand(tripsListCmd(), tripsBulkCmd(), tripsBulkShowCmd(), tripsBulkCancelCmd())
	return cmd
}

func tripsListCmd() *cobra.Command {
	var of opFlags
	var ff tripFilterFlags
	var order string
	var limit int
	var all bool
	cmd := &cobra.Command{
		Use: "list", Short: "List the trips a filter matches, newest first (--order oldest: oldest first)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newActionClient(of.dir)
			if err != nil {
				return err
			}
			q := ff.values()
			q.Set("order", order)
			q.Set("limit", strconv.Itoa(limit))
			q.Set("count", "1")
			var items []reconciler.TripListItem
			var count int64
			for {
				var page reconciler.TripPage
				if err := c.do(cmd.Context(), http.MethodGet, "/api/trips?"+q.Encode(), nil, nil, &page); err != nil {
					return fmt.Errorf("trips: %w", err)
				}
				if page.Count != nil {
					count = *page.Count
				}
				items = append(items, page.Items...)
				if !all || page.Next == "" {
					break
				}
				q.Set("cursor", page.Next)
				q.Del("count")
			}
			w := cmd.OutOrStdout()
			if of.asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"count": count, "items": items})
			}
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "TRIP\tSTATUS\tAGE\tOPEN STEP\tSTATE\tATTEMPTS\tLAST ERROR\tFINDINGS")
			for _, it := range items {
				step, state, attempts, lastErr := "-", "-", "-", "-"
				if s := it.OpenStep; s != nil {
					step, state, attempts, lastErr = s.Company+": "+s.Step, s.State, strconv.Itoa(s.Attempts), oneLine(s.LastError, 60)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", it.TripID, it.Status, (time.Duration(it.AgeMs) * time.Millisecond).Round(time.Second),
					step, state, attempts, lastErr, strings.Join(it.Findings, ","))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(w, "%d of %d trips matching\n", len(items), count)
			return nil
		},
	}
	of.read(cmd)
	ff.add(cmd)
	cmd.Flags().StringVar(&order, "order", "newest", "newest or oldest first (by the trip's first event)")
	cmd.Flags().IntVar(&limit, "limit", reconciler.DefaultTripPage, fmt.Sprintf("trips a page, 1 to %d", reconciler.MaxTripPage))
	cmd.Flags().BoolVar(&all, "all", false, "every page, not only the first")
	return cmd
}

func tripsBulkCmd() *cobra.Command {
	var of opFlags
	var ff tripFilterFlags
	var br reconciler.BulkRequest
	var yes int
	var follow bool
	cmd := &cobra.Command{
		Use:   "bulk <action>",
		Short: "Apply an action to every trip a filter matches: a dry run, then --yes <count> to run it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newActionClient(of.dir)
			if err != nil {
				return err
			}
			body := map[string]any{"action": args[0], "filter": ff.object(), "rate_per_s": br.RatePerS, "canary": br.Canary,
				"reason": of.reason, "operator": of.operator}
			for k, v := range map[string]string{"service": of.service, "incident": br.Incident, "outcome": br.Outcome, "step": br.Step} {
				if v != "" {
					body[k] = v
				}
			}
			w := cmd.OutOrStdout()
			if !cmd.Flags().Changed("yes") {
				body["dry_run"] = true
				raw, err := json.Marshal(body)
				if err != nil {
					return err
				}
				var d reconciler.BulkDryRun
				h := http.Header{"Content-Type": {"application/json"}}
				if err := c.do(cmd.Context(), http.MethodPost, "/api/bulk-actions", h, raw, &d); err != nil {
					return fmt.Errorf("bulk dry run: %w", err)
				}
				if of.asJSON {
					return json.NewEncoder(w).Encode(d)
				}
				fmt.Fprintf(w, "dry run: %d trips match %s and would get %s\n", d.Count, d.Filter, d.Action)
				for svc, n := range d.ByService {
					fmt.Fprintf(w, "  %s: %d\n", cmp.Or(svc, "nobody (no unfinished step: skipped)"), n)
				}
				for _, t := range d.Sample {
					fmt.Fprintf(w, "  e.g. %s at %s\n", t.TripID, cmp.Or(t.Service, "-"))
				}
				fmt.Fprintf(w, "nothing was recorded; to run it: the same command with --yes %d --reason ...\n", d.Count)
				return nil
			}
			if strings.TrimSpace(of.reason) == "" {
				return errors.New("--reason is required: say why (it is recorded with every trip's action)")
			}
			body["expected_count"] = yes
			key := of.key
			if key == "" {
				key = "cli-bulk-" + ulid.Make().String()
			}
			var b reconciler.BulkAction
			if err := c.postJSON(cmd.Context(), "/api/bulk-actions", key, body, &b); err != nil {
				return fmt.Errorf("bulk action: %w", err)
			}
			fmt.Fprintf(w, "bulk action %s: %s of %d trips, recorded (Idempotency-Key %s); progress at %s/bulk/%s\n", b.ID, b.Action, b.Trips, key, c.base, b.ID)
			if !follow {
				return nil
			}
			return followBulk(cmd, c, b)
		},
	}
	of.act(cmd, false)
	ff.add(cmd)
	cmd.Flags().StringVar(&of.service, "service", "", "the service that carries every trip's action out (default: each trip's open step's company)")
	cmd.Flags().Float64Var(&br.RatePerS, "rate", 5, "actions per second per company (0: no limit)")
	cmd.Flags().IntVar(&br.Canary, "canary", 0, "send this many trips first and stop if any failed")
	cmd.Flags().StringVar(&br.Incident, "incident", "", "resolve: the incident kind (default: every open one)")
	cmd.Flags().StringVar(&br.Outcome, "outcome", "", "settle: undone, done or not_done")
	cmd.Flags().StringVar(&br.Step, "action-step", "", "settle: the step (when the service owns several); redrive: the step to re-drive each trip from (--step filters by the open step)")
	cmd.Flags().IntVar(&yes, "yes", 0, "run it, confirming the dry run's count: refused if the filter matches another count now")
	cmd.Flags().BoolVar(&follow, "follow", true, "follow its progress until it ends")
	return cmd
}

// followBulk shows b's progress until it ends and prints how it ended;
// exit 1 when it was stopped or any trip failed.
func followBulk(cmd *cobra.Command, c *actionClient, b reconciler.BulkAction) error {
	w := cmd.ErrOrStderr()
	bar := progressbar.NewOptions(b.Trips, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(b.ID),
		progressbar.OptionShowCount(), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
	for {
		var now reconciler.BulkAction // fresh each time: the answer leaves zero counts out
		if err := c.do(cmd.Context(), http.MethodGet, "/api/bulk-actions/"+b.ID, nil, nil, &now); err != nil {
			return fmt.Errorf("bulk action %s: %w", b.ID, err)
		}
		b = now
		_ = bar.Set(b.Counts[reconciler.BulkTripDone] + b.Counts[reconciler.BulkTripFailed] + b.Counts[reconciler.BulkTripSkipped])
		if b.Ended() {
			break
		}
		select {
		case <-cmd.Context().Done():
			return cmd.Context().Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	_ = bar.Finish()
	fmt.Fprintf(cmd.OutOrStdout(), "bulk action %s %s: %s (done %d, failed %d, skipped %d)\n", b.ID, b.State, b.StateReason,
		b.Counts[reconciler.BulkTripDone], b.Counts[reconciler.BulkTripFailed], b.Counts[reconciler.BulkTripSkipped])
	if b.State != reconciler.BulkDone || b.Counts[reconciler.BulkTripFailed] > 0 {
		return exitCodeError{code: 1, err: fmt.Errorf("bulk action %s: %s", b.ID, b.StateReason)}
	}
	return nil
}

func tripsBulkShowCmd() *cobra.Command {
	var of opFlags
	cmd := &cobra.Command{
		Use: "bulk-show <id>", Short: "Show a bulk action: its audit record, counts and trips", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newActionClient(of.dir)
			if err != nil {
				return err
			}
			var b reconciler.BulkAction
			if err := c.do(cmd.Context(), http.MethodGet, "/api/bulk-actions/"+url.PathEscape(args[0]), nil, nil, &b); err != nil {
				return fmt.Errorf("bulk action %s: %w", args[0], err)
			}
			w := cmd.OutOrStdout()
			if of.asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(b)
			}
			fmt.Fprintf(w, "bulk action %s: %s of %d trips matching %s, %s\n", b.ID, b.Action, b.Trips, b.Filter, b.State)
			if b.StateReason != "" {
				fmt.Fprintf(w, "  %s\n", b.StateReason)
			}
			fmt.Fprintf(w, "asked by %s at %s: %s\n", b.Operator, b.CreatedAt.Format(time.RFC3339), b.Reason)
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "TRIP\tSERVICE\tSTATE\tWHAT IT DID")
			for _, t := range b.Items {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.TripID, t.Service, t.State, oneLine(t.Effect, 80))
			}
			return tw.Flush()
		},
	}
	of.read(cmd)
	return cmd
}

func tripsBulkCancelCmd() *cobra.Command {
	var of opFlags
	cmd := &cobra.Command{
		Use: "bulk-cancel <id>", Short: "Cancel a bulk action: the trips not sent yet are skipped", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(of.reason) == "" {
				return errors.New("--reason is required: say why")
			}
			c, err := newActionClient(of.dir)
			if err != nil {
				return err
			}
			var b reconciler.BulkAction
			if err := c.postJSON(cmd.Context(), "/api/bulk-actions/"+url.PathEscape(args[0])+"/cancel", "",
				map[string]string{"operator": of.operator, "reason": of.reason}, &b); err != nil {
				return fmt.Errorf("cancel %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "bulk action %s %s: %s\n", b.ID, b.State, b.StateReason)
			return nil
		},
	}
	of.act(cmd, false)
	return cmd
}
