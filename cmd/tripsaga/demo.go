package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/demo"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/reconciler"
)

func demoCmd() *cobra.Command {
	var asJSON, keep bool
	var dir, steps string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start everything (as up does), book trips in ten situations and judge each against the companies' records",
		Long: `demo starts the whole system in a fresh folder, books trips in ten
situations (all well, sold out, declined, a SIGKILL after the charge, a lost
answer, a hanging company, refunds failing for 30 s, a repeated POST, a
confirmed trip the traveler cancels inside 7 days) and prints, for each:
the answer and its time, the trip's status, what each company's records
hold, and the verdict: whole, empty, "fee kept; rest refunded" (the
traveler's cancellation) or HALF. It exits
non-zero if any verdict is HALF or differs from what the situation must end in.

With --steps hotel,insurance,payment,car (or STEPS in the environment) the
saga runs with the optional insurance step: every situation runs with four
steps, the insurer's policy is judged too, and the situation "the insurer
rejecting" is added. With --steps hotel,car,payment (charge-last: the
payment is the pivot, charged once the hold and the car are in) a sold-out
car never touches the card, a declined card cancels the booked car, and
the two refund situations become the same faults on the car's cancel
(failing for 30 s; refused, then settled by an operator).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if steps != "" { // the stack's children inherit it
				if _, err := events.ParseSteps(steps); err != nil {
					return err
				}
				if err := os.Setenv(events.StepsVar, steps); err != nil {
					return err
				}
			}
			return runDemo(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), dir, keep, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON array, an object per situation")
	cmd.Flags().StringVar(&dir, "dir", "", "folder for the stack's data and logs (default: a new temp folder)")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the folder (logs, data) after the demo")
	cmd.Flags().StringVar(&steps, "steps", "", "the saga's steps in order, as STEPS: hotel,insurance,payment,car adds the optional insurance step, hotel,car,payment charges last (the last step named that can be the pivot is the pivot; default: STEPS, else hotel,payment,car)")
	return cmd
}

func runDemo(ctx context.Context, out, errw io.Writer, dir string, keep, asJSON bool) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "tripsaga-demo-")
		if err != nil {
			return err
		}
		dir = d
		if !keep {
			defer os.RemoveAll(d)
		}
	}
	fmt.Fprintf(errw, "starting NATS, PostgreSQL, the simulators and every service in %s ...\n", dir)
	start := time.Now()
	s, err := stack.Start(ctx, stack.Config{Dir: dir, Logger: demoLogger(errw), Env: []string{reconciler.OperatorTokenEnv + "=" + demoToken}})
	if err != nil {
		return err
	}
	defer s.Stop()
	fmt.Fprintf(errw, "up in %s; trips API at %s\n", time.Since(start).Round(time.Millisecond), s.URL("trips"))
	env := demoEnv(s, errw)
	outcomes := runSituations(ctx, env, func(o *demo.Outcome) {
		fmt.Fprintf(errw, "  %-45s %s, %s\n", o.Situation, o.Status, o.Verdict)
	})
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(outcomes); err != nil {
			return err
		}
	} else {
		printTable(out, outcomes)
	}
	var bad []string
	for _, o := range outcomes {
		if !o.OK || o.Verdict == demo.Half {
			bad = append(bad, o.Situation)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d situation(s) did not end as they must: %s (logs in %s)", len(bad), strings.Join(bad, "; "), dir)
	}
	return nil
}

// demoToken is the operators' token of the demo's reconciler: the demo's
// own stack, which an operator's settle ends one situation of.
var demoToken = "demo-" + ulid.Make().String() //nolint:gochecknoglobals // one per process

// demoLogger is the supervisor's logger in the demo: warnings and errors
// only, on errw, between the demo's own progress lines.
func demoLogger(errw io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(errw, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// demoEnv points the demo at s. Its Kill says on errw, before the
// supervisor's own "process exited; restarting" line, that the kill is the
// situation being shown, and when the process is back.
func demoEnv(s *stack.Stack, errw io.Writer) *demo.Env {
	urls := s.CompanyURLs()
	var insurer string
	if demo.InsuranceOn(events.Selected()) {
		insurer = urls["INSURER_URL"]
	}
	return &demo.Env{
		TripsURL: s.URL("trips"), PaymentURL: s.URL("payment"), CarURL: s.URL("car"), InsurerURL: insurer,
		ReconcilerURL: s.URL("reconciler"), OperatorToken: demoToken,
		HotelURL: urls["HOTEL_URL"], PaymentsURL: urls["PAYMENTS_URL"], CarsURL: urls["CARS_URL"], MailURL: urls["MAIL_URL"],
		Kill: func(ctx context.Context, name string) error {
			fmt.Fprintf(errw, "  >> killing %s (pid %d) with SIGKILL on purpose: this is the situation being shown, not a failure;\n"+
				"  >> the supervisor's \"process exited; restarting\" warning that follows is it starting %s again\n", name, s.Pid(name), name)
			if _, err := s.Kill(name); err != nil {
				return err
			}
			if err := s.WaitReady(ctx, name); err != nil {
				return err
			}
			fmt.Fprintf(errw, "  >> %s is back (pid %d) and learns by key what happened before the kill\n", name, s.Pid(name))
			return nil
		},
	}
}

// runSituations runs the slow situation (refunds failing for 30 s) in the
// background and the others one after another, and returns the outcomes in
// the situations' order.
func runSituations(ctx context.Context, env *demo.Env, progress func(*demo.Outcome)) []*demo.Outcome {
	sits := demo.SituationsOf(events.Selected())
	outcomes := make([]*demo.Outcome, len(sits))
	slow := -1
	done := make(chan struct{})
	for i, s := range sits {
		if strings.HasPrefix(s.Name, "refunds fail") {
			slow = i
			go func() {
				defer close(done)
				outcomes[i] = s.Run(ctx, env)
			}()
		}
	}
	if slow < 0 {
		close(done)
	}
	for i, s := range sits {
		if i == slow {
			continue
		}
		outcomes[i] = s.Run(ctx, env)
		progress(outcomes[i])
	}
	<-done
	if slow >= 0 {
		progress(outcomes[slow])
	}
	return outcomes
}

func printTable(w io.Writer, outcomes []*demo.Outcome) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SITUATION\tANSWER\tANSWER MS\tSETTLED MS\tSTATUS\tCOMPANIES' RECORDS\tVERDICT\t")
	for _, o := range outcomes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", o.Situation, o.Answer, strconv.FormatInt(o.AnswerMS, 10), strconv.FormatInt(o.SettledMS, 10), o.Status, o.Records, o.Verdict)
	}
	_ = tw.Flush()
	for _, o := range outcomes {
		for _, n := range o.Notes {
			fmt.Fprintf(w, "  - %s: %s\n", o.Situation, n)
		}
	}
}
