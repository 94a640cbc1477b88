package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/reconciler"
)

// redriveCmd is `tripsaga redrive <trip> --from-step S`: the reconciler's
// POST /api/trips/{trip_id}/redrive.
func redriveCmd() *cobra.Command {
	var f opFlags
	var step string
	var dry bool
	cmd := &cobra.Command{
		Use:   "redrive <trip> --from-step <step>",
		Short: "Re-deliver a trip's events from a step on to the services that consume them, through their inboxes (--dry-run: list them)",
		Long: `Hands every stored event of the trip from the step on (the step's triggers,
everything it and the steps after it publish, their undos, and from a saga
step the undos of the steps before it) to every service that consumes it
and carries out operator actions, the reconciler's projection among them:
one redrive action on the OPERATOR stream a delivery, recorded in the
audit trail. Each service hands the event to its inbox, which drops it
when it has handled it already (by event id), so nothing acts twice.

--dry-run lists what would be delivered (kind, stream, sequence, event id,
consumer) and what is skipped and why, and records nothing; it needs no
token. The re-drive itself needs OPERATOR_TOKEN and --reason; the same
--key twice records once.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if step == "" {
				return errors.New("--from-step is required: the step to re-drive the trip from (hotel, payment, car, confirm, mail, ...)")
			}
			req := reconciler.RedriveFromRequest{Step: step, DryRun: dry, Operator: f.operator, Reason: f.reason}
			if !dry && strings.TrimSpace(f.reason) == "" {
				return errors.New("--reason is required: say why (it is recorded with every action), or --dry-run")
			}
			c, err := newActionClient(f.dir)
			if err != nil {
				return err
			}
			h := http.Header{}
			h.Set("Content-Type", "application/json")
			key := f.key
			if !dry {
				if c.token == "" {
					return fmt.Errorf("%s is not set: a re-drive needs the operator token the reconciler was started with (a --dry-run does not)", reconciler.OperatorTokenEnv)
				}
				if key == "" {
					key = "cli-" + ulid.Make().String()
				}
				h.Set("Authorization", "Bearer "+c.token)
				h.Set("Idempotency-Key", key)
			}
			body, err := json.Marshal(req)
			if err != nil {
				return err
			}
			var plan reconciler.RedrivePlan
			path := "/api/trips/" + url.PathEscape(args[0]) + "/redrive"
			for attempt := 1; ; attempt++ {
				err = c.do(cmd.Context(), http.MethodPost, path, h, body, &plan)
				var pe *problemError
				if err == nil || errors.As(err, &pe) && pe.Status != http.StatusServiceUnavailable || attempt == 5 || cmd.Context().Err() != nil {
					break
				}
				time.Sleep(time.Duration(attempt) * 300 * time.Millisecond) // the same key again: recorded once
			}
			if err != nil {
				return fmt.Errorf("redrive %s from %s: %w", args[0], step, err)
			}
			w := cmd.OutOrStdout()
			if f.asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(plan)
			}
			switch {
			case dry:
				fmt.Fprintf(w, "dry run: trip %s (version %s) from step %s would deliver %d event(s); nothing recorded\n", plan.Trip, plan.Version, plan.Step, len(plan.Deliveries))
			case plan.Replayed:
				fmt.Fprintf(w, "Idempotency-Key %s was used for this re-drive already: %d action(s) recorded then, none now\n", key, len(plan.Actions))
			default:
				fmt.Fprintf(w, "trip %s (version %s) re-driven from step %s by %s: %d action(s), Idempotency-Key %s\n", plan.Trip, plan.Version, plan.Step, f.operator, len(plan.Actions), key)
			}
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			if len(plan.Deliveries) > 0 {
				fmt.Fprintln(tw, "KIND\tSTREAM\tSEQ\tEVENT\tCONSUMER\tACTION")
				for _, d := range plan.Deliveries {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", dash(d.Kind), d.Stream, d.Seq, dash(d.EventID), d.Consumer, dash(d.ActionID))
				}
			}
			_ = tw.Flush()
			if len(plan.Skipped) > 0 {
				fmt.Fprintln(w, "skipped:")
				for _, s := range plan.Skipped {
					fmt.Fprintf(w, "  %s %s #%d to %s: %s\n", s.Kind, s.Stream, s.Seq, dash(s.Consumer), s.Why)
				}
			}
			if !dry && len(plan.Actions) > 0 {
				fmt.Fprintf(w, "each service carries its part out from stream OPERATOR: see `tripsaga timeline %s`\n", plan.Trip)
			}
			return nil
		},
	}
	f.act(cmd, false)
	// act's --wait waits on one action's outcome; a re-drive has many.
	_ = cmd.Flags().MarkHidden("wait")
	cmd.Flags().StringVar(&step, "from-step", "", "the step of the trip's version to re-drive from: hotel, payment, car, confirm, mail, ... (required)")
	cmd.Flags().BoolVar(&dry, "dry-run", false, "list what would be delivered and record nothing")
	return cmd
}
