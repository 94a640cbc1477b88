package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/reconciler"
)

// errNoTrip is returned by `tripsaga timeline` when nothing matches.
var errNoTrip = errors.New("no trip matches")

func timelineCmd() *cobra.Command {
	var asJSON bool
	var dir string
	cmd := &cobra.Command{
		Use:   "timeline <trip id | Idempotency-Key | email | company record id>",
		Short: "Print one trip's timeline from every stream, step log, incident and company (asks the reconciler at RECONCILER_URL, or the up running in --dir)",
		Long: `Print one trip's timeline: every event about it on every stream (and the
copies parked on DEADLETTER), each service's step log rows and incidents,
in time order with one column per service, then the companies' current
records and where the trip stopped. The reconciler gathers it
(GET /api/trips/{id}/timeline); its dashboard shows the same at /trips/{id}.

The argument is a trip id, or anything the dashboard's search finds a trip
by: a trip request's Idempotency-Key, a traveler's email, a step's key
("<trip>:hotel") or a company record id (hold_id, charge_id, booking_id).

It reaches the reconciler at RECONCILER_URL, or, with --dir D, through the
"tripsaga up --dir D" running there (D/up.env); with neither, through an up
running in the default folder .tripsaga.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			base, err := reconcilerURL(dir)
			if err != nil {
				return fmt.Errorf("timeline: %w", err)
			}
			raw, t, err := fetchTimeline(cmd.Context(), base, args[0])
			if err != nil {
				return fmt.Errorf("timeline: %w", err)
			}
			w := cmd.OutOrStdout()
			if asJSON {
				_, err := w.Write(raw)
				return err
			}
			printTimeline(w, t)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the timeline as JSON (the reconciler's answer)")
	cmd.Flags().StringVar(&dir, "dir", "", "`folder` of a running tripsaga up to use (default: RECONCILER_URL, else .tripsaga)")
	return cmd
}

// reconcilerURL is RECONCILER_URL, from the up running in dir when dir is
// set or the variable is not.
func reconcilerURL(dir string) (string, error) {
	if dir == "" && os.Getenv("RECONCILER_URL") == "" {
		if _, running, _ := stack.Running(defaultUpDir); running {
			dir = defaultUpDir
		}
	}
	if dir != "" {
		vars, err := envFromUpDir(dir)
		if err != nil {
			return "", err
		}
		if vars["RECONCILER_URL"] != "" {
			return vars["RECONCILER_URL"], nil
		}
	}
	if u := os.Getenv("RECONCILER_URL"); u != "" {
		return strings.TrimRight(u, "/"), nil
	}
	if stale := staleUp(defaultUpDir); stale != "" {
		return "", fmt.Errorf("RECONCILER_URL is not set: %s", stale)
	}
	return "", errors.New("RECONCILER_URL is not set (set it as `tripsaga up` prints it, or name the folder of a running up with --dir)")
}

// fetchTimeline asks the reconciler for the timeline of what: a trip id,
// else the one trip its search finds.
func fetchTimeline(ctx context.Context, base, what string) ([]byte, reconciler.Timeline, error) {
	var t reconciler.Timeline
	client := &http.Client{Timeout: 30 * time.Second}
	get := func(u string) (int, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return 0, nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	trip := what
	code, body, err := get(base + "/api/trips/" + url.PathEscape(trip) + "/timeline")
	if err != nil {
		return nil, t, err
	}
	if code == http.StatusNotFound {
		code, body, err = get(base + "/api/search?q=" + url.QueryEscape(what))
		if err != nil {
			return nil, t, err
		}
		if code != http.StatusOK {
			return nil, t, fmt.Errorf("search %q: %d %s", what, code, strings.TrimSpace(string(body)))
		}
		var hits struct {
			Items []reconciler.SearchHit `json:"items"`
		}
		if err := json.Unmarshal(body, &hits); err != nil {
			return nil, t, fmt.Errorf("search %q: %w", what, err)
		}
		switch len(hits.Items) {
		case 0:
			return nil, t, fmt.Errorf("%q: %w (not a trip id, Idempotency-Key, email or company record id the system knows)", what, errNoTrip)
		case 1:
			trip = hits.Items[0].TripID
		default:
			var ids []string
			for _, h := range hits.Items {
				ids = append(ids, h.TripID+" ("+h.Matched+")")
			}
			return nil, t, fmt.Errorf("%q matches %d trips; name one: %s", what, len(ids), strings.Join(ids, ", "))
		}
		code, body, err = get(base + "/api/trips/" + url.PathEscape(trip) + "/timeline")
		if err != nil {
			return nil, t, err
		}
	}
	if code != http.StatusOK {
		return nil, t, fmt.Errorf("trip %s: %d %s", trip, code, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, &t); err != nil {
		return nil, t, fmt.Errorf("trip %s: %w", trip, err)
	}
	return body, t, nil
}

// printTimeline renders t as text: the trip, where it stopped, a table
// with one column per service, and the companies' records.
func printTimeline(w io.Writer, t reconciler.Timeline) {
	status := "unknown to the reconciler's projection"
	if t.View != nil {
		status = t.View.Status
	}
	fmt.Fprintf(w, "trip %s: %s\nwhere it stopped: %s\n", t.TripID, status, t.Stopped)
	for _, u := range t.Unread {
		fmt.Fprintf(w, "not read: %s\n", u)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprint(tw, "TIME (UTC)\t+\t")
	for _, c := range t.Columns {
		fmt.Fprintf(tw, "%s\t", strings.ToUpper(c))
	}
	fmt.Fprintln(tw, "DETAIL")
	var first time.Time
	if len(t.Entries) > 0 {
		first = t.Entries[0].At
	}
	for _, e := range t.Entries {
		fmt.Fprintf(tw, "%s\t%s\t", e.At.Format("15:04:05.000"), e.At.Sub(first).Round(time.Millisecond))
		for _, c := range t.Columns {
			if c == e.Column {
				fmt.Fprintf(tw, "%s\t", e.What)
			} else {
				fmt.Fprint(tw, "·\t")
			}
		}
		fmt.Fprintln(tw, e.Detail)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\ncompanies' records now:")
	for _, r := range t.Records {
		state := "not asked"
		switch {
		case r.Error != "":
			state = "not read: " + r.Error
		case r.Record != nil:
			state = r.Record.Status()
		case r.None:
			state = "none (no record of this key)"
		}
		key := r.Key
		if key == "" {
			key = "(none to ask by)"
		} else if r.KeyFrom == reconciler.KeyFromConvention {
			key += " (no step row read)"
		}
		fmt.Fprintf(w, "  %-9s %-9s %-40s %s\n", r.Company, r.Resource, key, state)
	}
	for _, f := range t.Findings {
		if f.ResolvedAt == nil {
			fmt.Fprintf(w, "finding %s: %s\n  what to do: %s\n", f.Kind, f.Detail, reconciler.FindingToDo(f.Kind))
		}
	}
}
