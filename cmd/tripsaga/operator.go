package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/oklog/ulid/v2"
	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/stack"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/reconciler"
)

// opFlags are the flags every operator command shares.
type opFlags struct {
	dir      string
	asJSON   bool
	reason   string
	operator string
	key      string
	service  string
	wait     time.Duration
}

func (f *opFlags) read(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.dir, "dir", "", "`folder` of a running tripsaga up (its up.env) to use instead of RECONCILER_URL")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print JSON")
}

func (f *opFlags) act(cmd *cobra.Command, needService bool) {
	f.read(cmd)
	def := os.Getenv("USER")
	if u, err := user.Current(); err == nil && def == "" {
		def = u.Username
	}
	cmd.Flags().StringVar(&f.reason, "reason", "", "why (required; recorded with the action)")
	cmd.Flags().StringVar(&f.operator, "operator", def, "who asks (recorded with the action)")
	cmd.Flags().StringVar(&f.key, "key", "", "Idempotency-Key of the action (default: a new one); the same key again acts once")
	cmd.Flags().DurationVar(&f.wait, "wait", 30*time.Second, "how long to wait for the service to report what it did (0: do not wait); exit 0 done, 1 refused or nothing done, 3 not reported in time")
	if needService {
		cmd.Flags().StringVar(&f.service, "service", "", "the service that carries it out: hotel, payment or car (required)")
	}
}

// actionClient posts actions to the reconciler's API and reads from it.
type actionClient struct {
	base  string
	token string
	http  *http.Client
}

func newActionClient(dir string) (*actionClient, error) {
	base, err := reconcilerURL(dir)
	if err != nil {
		return nil, err
	}
	return &actionClient{base: strings.TrimRight(base, "/"), token: operatorToken(dir), http: &http.Client{Timeout: 30 * time.Second}}, nil
}

// operatorToken is OPERATOR_TOKEN, else the one in the up.env of the up
// the tools use (--dir D, or the default folder's when RECONCILER_URL is
// unset), which `tripsaga up` makes when none was set; "" when neither.
func operatorToken(dir string) string {
	if tok := os.Getenv(reconciler.OperatorTokenEnv); tok != "" {
		return tok
	}
	if dir == "" && os.Getenv("RECONCILER_URL") == "" {
		if _, running, _ := stack.Running(defaultUpDir); running {
			dir = defaultUpDir
		}
	}
	if dir == "" {
		return ""
	}
	vars, err := envFromUpDir(dir)
	if err != nil {
		return ""
	}
	return vars[reconciler.OperatorTokenEnv]
}

// problemError is an answer of the reconciler that is not a success.
type problemError struct {
	Status  int
	Problem process.Problem
}

func (e *problemError) Error() string {
	msg := e.Problem.Title
	if e.Problem.Detail != "" {
		msg += ": " + e.Problem.Detail
	}
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return fmt.Sprintf("%d %s", e.Status, msg)
}

func (c *actionClient) do(ctx context.Context, method, path string, header http.Header, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		pe := &problemError{Status: resp.StatusCode}
		_ = json.Unmarshal(raw, &pe.Problem)
		return pe
	}
	return json.Unmarshal(raw, out)
}

// post sends an action with the operator token and Idempotency-Key key,
// sending it again with the same key when no answer came (the reconciler
// acts once), and returns the action event.
func (c *actionClient) post(ctx context.Context, key string, ar reconciler.ActionRequest) (event.Event, error) {
	var ev event.Event
	err := c.postJSON(ctx, "/api/actions", key, ar, &ev)
	return ev, err
}

// postJSON posts v to path with the operator token and Idempotency-Key
// key (none when ""), sending it again with the same key when the
// reconciler answered 503 (it acts once), into out.
func (c *actionClient) postJSON(ctx context.Context, path, key string, v, out any) error {
	if c.token == "" {
		return fmt.Errorf("%s is not set: actions need the operator token the reconciler was started with", reconciler.OperatorTokenEnv)
	}
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+c.token)
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	h.Set("Content-Type", "application/json")
	for attempt := 1; ; attempt++ {
		err = c.do(ctx, http.MethodPost, path, h, body, out)
		var pe *problemError
		if err == nil || errors.As(err, &pe) && pe.Status != http.StatusServiceUnavailable || attempt == 5 || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(attempt) * 300 * time.Millisecond)
	}
}

// runAction posts ar and prints the recorded action.
func runAction(cmd *cobra.Command, f *opFlags, ar reconciler.ActionRequest) error {
	if strings.TrimSpace(f.reason) == "" {
		return errors.New("--reason is required: say why (it is recorded with the action)")
	}
	ar.Reason, ar.Operator = f.reason, f.operator
	if ar.Action != events.ActionRedrive && ar.Action != events.ActionDismiss && ar.Service == "" {
		return errors.New("--service is required: hotel, payment or car")
	}
	key := f.key
	if key == "" {
		key = "cli-" + ulid.Make().String()
	}
	c, err := newActionClient(f.dir)
	if err != nil {
		return err
	}
	ev, err := c.post(cmd.Context(), key, ar)
	if err != nil {
		return fmt.Errorf("%s: %w", ar.Action, err)
	}
	w := cmd.OutOrStdout()
	if f.asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(ev)
	}
	var d events.OperatorActionData
	_ = ev.DataAs(&d)
	fmt.Fprintf(w, "%s of trip %s asked of %s by %s (%s): event %s, Idempotency-Key %s\n",
		d.Action, d.TripID, d.Service, d.Operator, d.Reason, ev.ID(), key)
	if f.wait <= 0 {
		fmt.Fprintf(w, "recorded on stream %s; %s carries it out (see `tripsaga timeline %s`)\n", events.StreamOperator, d.Service, d.TripID)
		return nil
	}
	return waitOutcome(cmd.Context(), w, c, ev.ID(), d, f.wait)
}

// exitCodeError ends the command with its code (main): 1 an action
// refused or that did nothing, 3 one not reported in time.
type exitCodeError struct {
	code int
	err  error
}

func (e exitCodeError) Error() string { return e.err.Error() }
func (e exitCodeError) Unwrap() error { return e.err }

// waitOutcome waits up to wait for the service to report what it did of
// the recorded action id (GET /api/actions/{id}/outcome), prints it, and
// returns an exitCodeError when it refused the action or changed nothing
// (1), or did not report it in time (3: it is recorded and will be
// carried out once the service consumes it).
func waitOutcome(ctx context.Context, w io.Writer, c *actionClient, id string, d events.OperatorActionData, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var out reconciler.ActionOutcome
	for {
		err := c.do(ctx, http.MethodGet, "/api/actions/"+url.PathEscape(id)+"/outcome", nil, nil, &out)
		if err == nil && out.Reported {
			fmt.Fprintf(w, "%s: %s\n", d.Service, out.Effect)
			if !out.Done {
				return exitCodeError{1, fmt.Errorf("%s of trip %s: %s did nothing: %s", d.Action, d.TripID, d.Service, out.Effect)}
			}
			return nil
		}
		if err == nil && out.Unread != "" && strings.Contains(out.Unread, "is not known") {
			fmt.Fprintf(w, "recorded on stream %s; %s carries it out, but what it did cannot be read here (%s): see `tripsaga timeline %s`\n",
				events.StreamOperator, d.Service, out.Unread, d.TripID)
			return nil
		}
		select {
		case <-ctx.Done():
			why := "not reported yet"
			if err != nil {
				why = err.Error()
			} else if out.Unread != "" {
				why = out.Unread
			}
			return exitCodeError{3, fmt.Errorf("%s of trip %s is recorded, but %s has not reported what it did within %s (%s); it carries it out once it consumes stream %s: see `tripsaga timeline %s`",
				d.Action, d.TripID, d.Service, wait, why, events.StreamOperator, d.TripID)}
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func incidentsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "incidents",
		Short: "List the services' incidents and act on them (retry the undo now, resolve with a reason, settle a step done by hand)",
		Long: `Incidents are problems a service raised for a person: an undo that keeps
failing (compensation_stuck), a company refusing an undo, answers that
break the contract, credentials. Retries go on while one is open.

"list" reads every service's incidents through the reconciler
(GET /api/incidents). "retry" asks the service to call the trip's undo now
(and lifts a pause); "resolve" closes the trip's incidents at the service
with a reason (retries go on); "settle" records that a person did the
stuck step's work by hand (--outcome undone for an undo): its retries stop
and the saga finishes from there. Actions are events on the OPERATOR stream, posted to the
reconciler (POST /api/actions) with the bearer token in OPERATOR_TOKEN;
the same --key twice acts once.

The reconciler is found at RECONCILER_URL, or through the up running in
--dir (default .tripsaga).`,
	}
	var lf opFlags
	var all bool
	list := &cobra.Command{
		Use: "list", Short: "List open incidents of every service (--all: resolved ones too)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newActionClient(lf.dir)
			if err != nil {
				return err
			}
			var body struct {
				Items  []reconciler.ServiceIncident `json:"items"`
				Unread []string                     `json:"unread"`
			}
			if err := c.do(cmd.Context(), http.MethodGet, "/api/incidents", nil, nil, &body); err != nil {
				return fmt.Errorf("incidents: %w", err)
			}
			items := body.Items[:0:0]
			for _, in := range body.Items {
				if all || in.ResolvedAt == nil {
					items = append(items, in)
				}
			}
			w := cmd.OutOrStdout()
			if lf.asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"items": items, "unread": body.Unread})
			}
			for _, u := range body.Unread {
				fmt.Fprintf(w, "could not read: %s\n", u)
			}
			if len(items) == 0 {
				fmt.Fprintln(w, "no open incidents")
				return nil
			}
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "SERVICE\tTRIP\tSTEP\tKIND\tATTEMPTS\tAGE\tSTATE\tOWNER\tLAST ERROR")
			for _, in := range items {
				state := "open"
				if in.Escalated {
					state = "open, escalated"
				}
				if in.ResolvedAt != nil {
					state = "resolved"
					if in.ResolvedBy != "" {
						state += " by " + in.ResolvedBy
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", in.Service, in.TripID, in.Step, in.Kind, in.Calls(),
					time.Since(in.RaisedAt).Round(time.Second), state, cmp.Or(in.Owner, "-"), oneLine(in.LastError, 80))
			}
			return tw.Flush()
		},
	}
	lf.read(list)
	list.Flags().BoolVar(&all, "all", false, "resolved incidents too")

	var rf opFlags
	retry := &cobra.Command{
		Use: "retry <trip>", Short: "Make the trip's unfinished steps at the service due now, a stuck undo or a forward step stuck unknown (forward_stuck) alike; lifts a pause", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAction(cmd, &rf, reconciler.ActionRequest{Action: events.ActionRetryUndo, Trip: args[0], Service: rf.service})
		},
	}
	rf.act(retry, true)

	var sf opFlags
	var kind string
	resolve := &cobra.Command{
		Use: "resolve <trip>", Short: "Close the trip's open incidents at the service with a reason (retries go on)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAction(cmd, &sf, reconciler.ActionRequest{Action: events.ActionResolve, Trip: args[0], Service: sf.service, Incident: kind})
		},
	}
	sf.act(resolve, true)
	resolve.Flags().StringVar(&kind, "incident", "", "the incident kind to resolve (default: every open one of the trip at the service)")

	var tf opFlags
	var outcome, stepName string
	settle := &cobra.Command{
		Use:   "settle <trip>",
		Short: "Record that a person did a stuck step's work by hand: its retries stop, its event is published, the saga finishes",
		Long: `settle records that a person did, outside the system, what a stuck step
keeps failing to do (refunded the card by hand, released the room by phone):
the service marks the step settled by hand, stops its retries, resolves its
incidents and publishes its event with settled_by naming you
(payment.refunded for a refund), so the saga finishes from there: a
canceling trip whose last open undo this was settles canceled and the
traveler gets one mail.

--outcome undone settles an undo that raised its incident (compensation_stuck
or compensation_refused); done or not_done a step stuck unknown going
forward (not_done never for a step after the pivot: it only goes forward).
A step is settled once; a step that is not stuck is refused (409, or
"refused: ..." in the service's record of the action: tripsaga timeline).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if outcome == "" {
				return errors.New("--outcome is required: " + strings.Join(events.SettleOutcomes, ", ") + " (what a person did)")
			}
			return runAction(cmd, &tf, reconciler.ActionRequest{Action: events.ActionSettle, Trip: args[0], Service: tf.service, Outcome: outcome, Step: stepName})
		},
	}
	tf.act(settle, true)
	settle.Flags().StringVar(&outcome, "outcome", "", "what a person did: undone (the stuck undo), done or not_done (a step stuck unknown); required")
	settle.Flags().StringVar(&stepName, "step", "", "the step, when the service owns several (trips: mail, traveler_mail); default: the service's saga step")
	cmd.AddCommand(list, retry, resolve, settle)
	return cmd
}

func deadletterCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "deadletter",
		Short: "List, show and re-drive the events the services parked on the DEADLETTER stream",
		Long: `An inbox parks an event it can never handle (it cannot be decoded, its type
is unknown, its data is invalid, or it still fails after 25 deliveries
while PostgreSQL answers) on the DEADLETTER stream, with the reason and
the consumer that parked it.

"list" and "show" read them through the reconciler (GET /api/deadletters);
"redrive <seq>" hands one, once the cause is fixed, to the consumer that
parked it, and to no other: an action event on the OPERATOR stream that
the owning service carries out through its inbox (so an event it has
already handled is not handled twice). Re-driving needs OPERATOR_TOKEN.`,
	}
	var lf opFlags
	list := &cobra.Command{
		Use: "list", Short: "List the parked events, oldest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newActionClient(lf.dir)
			if err != nil {
				return err
			}
			var body struct {
				Items []reconciler.DeadLetter `json:"items"`
			}
			if err := c.do(cmd.Context(), http.MethodGet, "/api/deadletters", nil, nil, &body); err != nil {
				return fmt.Errorf("deadletter: %w", err)
			}
			w := cmd.OutOrStdout()
			if lf.asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(body.Items)
			}
			if len(body.Items) == 0 {
				fmt.Fprintln(w, "no dead letters")
				return nil
			}
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tPARKED\tCONSUMER\tFROM\tTRIP\tTYPE\tRE-DRIVEN\tREASON")
			for _, d := range body.Items {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s #%d\t%s\t%s\t%d\t%s\n", d.Seq, d.Time.Format(time.RFC3339), d.Consumer, d.Stream, d.StreamSeq,
					dash(d.TripID), dash(d.Type), len(d.RedrivenBy), oneLine(d.Reason, 80))
			}
			return tw.Flush()
		},
	}
	lf.read(list)

	var sf opFlags
	show := &cobra.Command{
		Use: "show <seq>", Short: "Show one parked event: its headers, body, reason and consumer", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			seq, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || seq == 0 {
				return fmt.Errorf("seq %q: want the DEADLETTER sequence (tripsaga deadletter list)", args[0])
			}
			c, err := newActionClient(sf.dir)
			if err != nil {
				return err
			}
			var d reconciler.DeadLetter
			if err := c.do(cmd.Context(), http.MethodGet, "/api/deadletters/"+args[0], nil, nil, &d); err != nil {
				return fmt.Errorf("deadletter %d: %w", seq, err)
			}
			w := cmd.OutOrStdout()
			if sf.asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(d)
			}
			fmt.Fprintf(w, "dead letter %d, parked %s by consumer %s\nfrom %s #%d, subject %s\nreason: %s\n",
				d.Seq, d.Time.Format(time.RFC3339), d.Consumer, d.Stream, d.StreamSeq, d.Subject, d.Reason)
			fmt.Fprintln(w, "headers:")
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			for _, k := range sortedHeaderKeys(d.Headers) {
				fmt.Fprintf(tw, "  %s\t%s\n", k, strings.Join(d.Headers[k], ", "))
			}
			_ = tw.Flush()
			fmt.Fprintf(w, "body:\n  %s\n", d.Data)
			if len(d.RedrivenBy) > 0 {
				fmt.Fprintf(w, "re-driven by: %s\n", strings.Join(d.RedrivenBy, ", "))
			}
			return nil
		},
	}
	sf.read(show)

	var rf opFlags
	redrive := &cobra.Command{
		Use: "redrive <seq>", Short: "Hand a parked event to the consumer that parked it, once the cause is fixed", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			seq, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || seq == 0 {
				return fmt.Errorf("seq %q: want the DEADLETTER sequence (tripsaga deadletter list)", args[0])
			}
			return runAction(cmd, &rf, reconciler.ActionRequest{Action: events.ActionRedrive, DeadLetterSeq: seq})
		},
	}
	rf.act(redrive, false)
	cmd.AddCommand(list, show, redrive)
	return cmd
}

func repairCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "repair",
		Short: "Undo a leaked company record, or pause and resume a trip's company calls at one service",
		Long: `"undo-leak <trip>" asks the service that owns the step to undo, by its
Idempotency-Key, a company record the reconciler's sweep found in force
where it should not be (an orphan, or a half trip's late commit past the
re-check horizon); the reconciler refuses it without such an open finding,
and the service refuses it for a step its trip still owns (done or
unfinished). "pause <trip>" stops every company call of the trip at the
service (retries, undos, late-commit checks) until "resume <trip>".
"dismiss <trip> --kind K" closes one of the reconciler's open findings as
seen, with --reason: it no longer counts as open while it holds, and is
resolved once the sweep no longer finds it (an unattributed record's
finding is named ?<company>/<record id>, as the findings list gives it).

Each is an event on the OPERATOR stream, posted to the reconciler with the
bearer token in OPERATOR_TOKEN; the same --key twice acts once.`,
	}
	mk := func(use, action, short string) *cobra.Command {
		var f opFlags
		c := &cobra.Command{
			Use: use + " <trip>", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return runAction(cmd, &f, reconciler.ActionRequest{Action: action, Trip: args[0], Service: f.service})
			},
		}
		f.act(c, true)
		return c
	}
	var df opFlags
	var kind string
	dismiss := &cobra.Command{
		Use: "dismiss <trip>", Short: "Close an open finding of the reconciler's as seen, with why", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if kind == "" {
				return errors.New("--kind is required: " + strings.Join(reconciler.FindingKinds, ", "))
			}
			return runAction(cmd, &df, reconciler.ActionRequest{Action: events.ActionDismiss, Trip: args[0], Incident: kind})
		},
	}
	df.act(dismiss, false)
	dismiss.Flags().StringVar(&kind, "kind", "", "the finding's kind: "+strings.Join(reconciler.FindingKinds, ", ")+" (required)")
	cmd.AddCommand(
		dismiss,
		mk("undo-leak", events.ActionUndoLeak, "Ask the owning service to undo a leaked company record by key"),
		mk("pause", events.ActionPause, "Stop the trip's company calls at the service until resumed"),
		mk("resume", events.ActionResume, "Let the trip's company calls go on (due at once)"),
	)
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func sortedHeaderKeys(h map[string][]string) []string { return slices.Sorted(maps.Keys(h)) }
