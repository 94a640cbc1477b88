package saga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/saga/internal/dbsqlc"
)

// CauseOperator is the undo cause of a step an operator asked to undo
// (events.ActionUndoLeak): its success publishes nothing, the operator's
// action event and the operator log are its record.
const CauseOperator = "operator"

// PauseRecheck is how long the runner leaves the rows of a paused trip
// before it looks at them again (a resume makes them due at once).
const PauseRecheck = 10 * time.Second

// OperatorEntry is one operator action a service carried out: who, what,
// why, when, and what it did.
type OperatorEntry struct {
	EventID  string    `json:"event_id"`
	TripID   string    `json:"trip_id"`
	Action   string    `json:"action"`
	Operator string    `json:"operator"`
	Reason   string    `json:"reason"`
	Effect   string    `json:"effect"`
	At       time.Time `json:"at"`
}

// OperatorLog returns the operator actions the service whose schema db
// reaches carried out for trip, oldest first.
func OperatorLog(ctx context.Context, db dbsqlc.DBTX, trip string) ([]OperatorEntry, error) {
	rows, err := queries.OperatorLogListByTrip(ctx, db, trip)
	if err != nil {
		return nil, fmt.Errorf("saga: operator log of %s: %w", trip, err)
	}
	out := make([]OperatorEntry, 0, len(rows))
	for _, r := range rows {
		out = append(out, OperatorEntry{EventID: r.EventID, TripID: r.TripID, Action: r.Action, Operator: r.Operator,
			Reason: r.Reason, Effect: r.Effect, At: r.At.UTC()})
	}
	return out, nil
}

// Paused reports whether an operator paused trip's company calls at the
// service whose schema db reaches, and who and why when so.
func Paused(ctx context.Context, db dbsqlc.DBTX, trip string) (paused bool, by, reason string, err error) {
	p, err := queries.TripPauseGet(ctx, db, trip)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, "", "", nil
	}
	if err != nil {
		return false, "", "", fmt.Errorf("saga: pause of %s: %w", trip, err)
	}
	return true, p.Operator, p.Reason, nil
}

// skipPaused takes the rows of paused trips out of a claim (inside its
// transaction tx): they are postponed by PauseRecheck instead of worked on.
// verify says the rows were claimed for a late-commit check.
func (r *Runner) skipPaused(ctx context.Context, tx pgx.Tx, rows []dbsqlc.Step, verify bool) ([]dbsqlc.Step, error) {
	if len(rows) == 0 {
		return rows, nil
	}
	trips := make([]string, 0, len(rows))
	for _, row := range rows {
		trips = append(trips, row.TripID)
	}
	paused, err := queries.TripPausedAmong(ctx, tx, trips)
	if err != nil || len(paused) == 0 {
		return rows, err
	}
	if verify {
		err = queries.StepPostponeVerify(ctx, tx, dbsqlc.StepPostponeVerifyParams{AfterMs: ms(PauseRecheck), TripIds: paused, Step: r.cfg.Spec.Name})
	} else {
		err = queries.StepPostpone(ctx, tx, dbsqlc.StepPostponeParams{AfterMs: ms(PauseRecheck), TripIds: paused, Step: r.cfg.Spec.Name})
	}
	if err != nil {
		return nil, fmt.Errorf("postpone paused trips: %w", err)
	}
	return slices.DeleteFunc(rows, func(row dbsqlc.Step) bool { return slices.Contains(paused, row.TripID) }), nil
}

// Operate carries out, inside tx (the action event's inbox transaction),
// an operator's action that names this runner's service, and writes it to
// the operator log with what it did:
//
//   - retry_undo: lifts a pause of the trip and makes its unfinished rows
//     (an undo that keeps failing, an unknown outcome) due now;
//   - pause: the runner claims none of the trip's rows until resume;
//   - resume: lifts the pause; the rows are due now;
//   - resolve: closes the trip's open incidents here (of kind d.Incident,
//     or all) with the operator and reason; retries go on;
//   - settle: records that a person did the stuck step's work by hand
//     ([Runner.settle]): its retries stop, its incidents are resolved,
//     its event is published with settled_by; refused, and logged so, for
//     a step that is not stuck or was settled already;
//   - undo_leak: undoes the step's record by its Idempotency-Key (a row
//     made compensating with cause [CauseOperator], or a new one when the
//     service never had the step, or when the step is done but its trip
//     has no trip.requested, Config.Origin telling, and was recorded
//     within events.MaxAge, while TRIPS still keeps it); refused, and logged
//     so, when the step is done for a trip the trips service took (or
//     Origin is nil) or still unfinished: a leak is a record the trip
//     should not have, and the trip's own step still owns those.
//
// The runner is woken after commit (through outbox.AfterCommit).
func (r *Runner) Operate(ctx context.Context, tx pgx.Tx, e event.Event, d events.OperatorActionData) error {
	trip := d.TripID
	effect := ""
	switch d.Action {
	case events.ActionRetryUndo, events.ActionResume:
		unpaused, err := queries.TripPauseDelete(ctx, tx, trip)
		if err != nil {
			return err
		}
		rows, err := queries.StepDueNow(ctx, tx, trip)
		if err != nil {
			return err
		}
		later := 0
		for _, row := range rows {
			if row.DueAfterCall {
				later++
			}
		}
		effect = fmt.Sprintf("%d unfinished step(s) due now", len(rows)-later)
		if later > 0 {
			// Never a second call of a key in flight: the owner makes the
			// row due when it writes its call's answer.
			effect += fmt.Sprintf(", %d as soon as its call in flight ends", later)
		}
		if unpaused > 0 {
			effect += "; pause lifted"
		}
	case events.ActionPause:
		n, err := queries.TripPauseInsert(ctx, tx, dbsqlc.TripPauseInsertParams{TripID: trip, Operator: d.Operator, Reason: d.Reason, EventID: e.ID()})
		if err != nil {
			return err
		}
		effect = "paused: no company call for the trip until resumed"
		if n == 0 {
			effect = "already paused"
		}
	case events.ActionResolve:
		n, err := queries.IncidentResolveByOperator(ctx, tx, dbsqlc.IncidentResolveByOperatorParams{
			Operator: &d.Operator, Reason: &d.Reason, TripID: trip, Kind: d.Incident,
		})
		if err != nil {
			return err
		}
		effect = fmt.Sprintf("%d open incident(s) resolved", n)
	case events.ActionUndoLeak:
		var err error
		if effect, err = r.undoLeak(ctx, tx, trip); err != nil {
			return err
		}
	case events.ActionSettle:
		var err error
		if effect, err = r.settle(ctx, tx, d); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: action %q is not carried out by a step service", inbox.ErrPermanent, d.Action)
	}
	if err := queries.OperatorLogInsert(ctx, tx, dbsqlc.OperatorLogInsertParams{
		EventID: e.ID(), TripID: trip, Action: d.Action, Operator: d.Operator, Reason: d.Reason, Effect: effect,
	}); err != nil {
		return fmt.Errorf("saga: operator log: %w", err)
	}
	r.log.Info("saga: operator action carried out", "action", d.Action, "trip_id", trip, "operator", d.Operator, "effect", effect)
	outbox.AfterCommit(ctx, r.Wake)
	return nil
}

func (r *Runner) undoLeak(ctx context.Context, tx pgx.Tx, trip string) (string, error) {
	if r.cfg.Spec.Class == events.ForwardOnly {
		return "refused: step " + r.cfg.Spec.Name + " is forward-only, never undone", nil
	}
	now, err := r.dbNow(ctx, tx)
	if err != nil {
		return "", err
	}
	row, err := queries.StepGetForUpdate(ctx, tx, dbsqlc.StepGetForUpdateParams{TripID: trip, Step: r.cfg.Spec.Name})
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := queries.StepInsertOperatorUndo(ctx, tx, dbsqlc.StepInsertOperatorUndoParams{
			TripID: trip, Step: r.cfg.Spec.Name, IdempotencyKey: r.Key(trip),
		}); err != nil {
			return "", fmt.Errorf("saga: operator undo of %s: %w", trip, err)
		}
		return "no step here: undoing " + r.Key(trip) + " by key", nil
	}
	if err != nil {
		return "", err
	}
	switch Status(row.Status) {
	case Compensated, Failed, Voided, Rejected:
		was := row.Status
		row.Status = string(Compensating)
		row.UndoCause = new(CauseOperator)
		row.NextAttemptAt = now
		row.VerifyAt = nil
		row.Outcome = new("an operator asked to undo a leaked record (the step was " + was + ")")
		if err := update(ctx, tx, row); err != nil {
			return "", err
		}
		return "step was " + was + ": undoing " + row.IdempotencyKey + " by key", nil
	case Done:
		if r.cfg.Origin == nil {
			break
		}
		if now.Sub(row.CreatedAt) >= events.MaxAge {
			// The streams no longer keep its trip.requested, if it had one.
			return "refused: step is done and older than the streams keep a trip.requested (" + events.MaxAge.String() + "); its own saga owns the record", nil
		}
		req, err := r.cfg.Origin(ctx, trip)
		if err != nil {
			return "", fmt.Errorf("saga: operator undo of %s: %w", trip, err)
		}
		if req != nil {
			break
		}
		// No trip.requested: no trip owns the record (the step was run
		// for a forged trigger), so nothing else will ever undo it.
		row.Status = string(Compensating)
		row.UndoCause = new(CauseOperator)
		row.NextAttemptAt = now
		row.VerifyAt = nil
		row.Outcome = new("an operator asked to undo a leaked record of a trip the trips service never took (the step was done)")
		if err := update(ctx, tx, row); err != nil {
			return "", err
		}
		return "step was done for a trip with no trip.requested: undoing " + row.IdempotencyKey + " by key", nil
	}
	return "refused: step is " + row.Status + "; its own saga owns the record", nil
}

// addOperatorInbox adds the inbox of the operators' actions when the
// catalogue names the service among those that carry them out.
func (s *Service) addOperatorInbox(metrics *inbox.Metrics) error {
	in, err := NewOperatorInbox(OperatorInboxConfig{
		Service: s.cfg.Spec.Service, Catalogue: s.cfg.Catalogue,
		Runners: append([]*Runner{s.Runner}, s.Extra...),
		Inboxes: func() []*inbox.Inbox { return s.inboxes },
		Pool:    s.cfg.Pool, JetStream: s.cfg.JetStream, Relay: s.relay, Logger: s.cfg.Logger, Metrics: metrics,
	})
	if err != nil || in == nil {
		return err
	}
	s.inboxes = append(s.inboxes, in)
	return nil
}

// OperatorInboxConfig is what [NewOperatorInbox] needs: the service, the
// runners of its steps (the first carries out an action's step part,
// [Runner.Operate], on the service's one step log; all are woken after it)
// and its other inboxes, which a re-drive hands a parked event back to.
type OperatorInboxConfig struct {
	Service   string
	Catalogue events.Catalogue
	Runners   []*Runner
	Inboxes   func() []*inbox.Inbox
	Pool      *pgxpool.Pool
	JetStream jetstream.JetStream
	Relay     *outbox.Relay
	Logger    *slog.Logger
	Metrics   *inbox.Metrics
	// Observe, when set, sees every action of the stream, those naming
	// another service too, in the action's inbox transaction and before
	// it is carried out; an error fails the handling like the action's
	// own (the event is redelivered). The trips service mails a
	// correction to a traveler told a trip was confirmed when an operator
	// repairs it (services/trips/correction.go).
	Observe func(ctx context.Context, tx pgx.Tx, e event.Event, d events.OperatorActionData) error
}

// NewOperatorInbox returns the inbox of the operators' actions (the
// OPERATOR stream) for cfg.Service, or nil when the catalogue does not
// name the service among those that carry them out (Operator.Consumers).
// Actions naming another service are acknowledged without effect. The
// inbox is optional (inbox.Config.Optional): the OPERATOR stream
// only feeds it, the reconciler owns it (and creates it again when lost),
// and no booking needs it, so a service never fails readiness for it
// (docs/contracts/trips-api.md, /readyz); it consumes once the stream
// appears.
func NewOperatorInbox(cfg OperatorInboxConfig) (*inbox.Inbox, error) {
	op := cfg.Catalogue.Operator
	if op.Type == "" || !slices.Contains(op.Consumers, cfg.Service) || len(cfg.Runners) == 0 {
		return nil, nil //nolint:nilnil // no inbox is not an error
	}
	return inbox.New(inbox.Config{
		Name: cfg.Service, Stream: events.StreamOperator, FilterSubjects: []string{events.Kind(op.Type) + ".>"},
		Types: []string{op.Type}, Pool: cfg.Pool, JetStream: cfg.JetStream, Handler: cfg.onOperator,
		Relay: cfg.Relay, Logger: cfg.Logger, Metrics: cfg.Metrics, Optional: true,
	})
}

// onOperator carries out an operator's action that names this service: a
// re-drive of an event one of its inboxes parked, or the steps' part
// ([Runner.Operate]).
func (cfg OperatorInboxConfig) onOperator(ctx context.Context, tx pgx.Tx, e event.Event) error {
	var d events.OperatorActionData
	if err := events.DecodeData(e, &d); err != nil {
		return err
	}
	if cfg.Observe != nil {
		if err := cfg.Observe(ctx, tx, e, d); err != nil {
			return err
		}
	}
	if d.Service != cfg.Service {
		return nil
	}
	if d.Action == events.ActionRedrive {
		dup, err := inbox.RedriveParked(ctx, tx, d.DeadLetter, cfg.Inboxes()...)
		if err != nil {
			return fmt.Errorf("redrive asked by %s: %w", d.Operator, err)
		}
		what := fmt.Sprintf("dead letter %d", d.DeadLetter.Seq)
		if d.DeadLetter.Seq == 0 { // a filtered replay (tripsaga replay --trip/--type)
			what = fmt.Sprintf("replayed %s #%d", d.DeadLetter.Stream, d.DeadLetter.StreamSeq)
		}
		effect := what + " re-driven into " + d.DeadLetter.Consumer
		if dup {
			effect = what + ": " + d.DeadLetter.Consumer + " had its event already"
		}
		return queries.OperatorLogInsert(ctx, tx, dbsqlc.OperatorLogInsertParams{
			EventID: e.ID(), TripID: d.TripID, Action: d.Action, Operator: d.Operator, Reason: d.Reason, Effect: effect,
		})
	}
	if err := events.ValidateTripID(d.TripID); err != nil {
		return fmt.Errorf("%w: %w", inbox.ErrPermanent, err)
	}
	acting := cfg.Runners[0]
	if d.Action == events.ActionSettle && d.Step != "" {
		// settle names the step when the service owns several.
		i := slices.IndexFunc(cfg.Runners, func(r *Runner) bool { return r.cfg.Spec.Name == d.Step })
		if i < 0 {
			return queries.OperatorLogInsert(ctx, tx, dbsqlc.OperatorLogInsertParams{
				EventID: e.ID(), TripID: d.TripID, Action: d.Action, Operator: d.Operator, Reason: d.Reason,
				Effect: fmt.Sprintf("refused: %s has no step %q", cfg.Service, d.Step),
			})
		}
		acting = cfg.Runners[i]
	}
	if err := acting.Operate(ctx, tx, e, d); err != nil {
		return err
	}
	for _, r := range cfg.Runners {
		if r != acting {
			outbox.AfterCommit(ctx, r.Wake)
		}
	}
	return nil
}

// settledPrefix starts the outcome of a step an operator settled by hand.
const settledPrefix = "settled by hand"

// Incident kinds by what got stuck: an undo, or a step going forward.
var (
	undoIncidents    = []string{IncidentCompensationStuck, IncidentCompensationRefused, IncidentCompensationAnswerMismatch} //nolint:gochecknoglobals // read-only
	forwardIncidents = []string{IncidentForwardStuck, IncidentForwardAnswerMismatch, IncidentCompanyCredentials}            //nolint:gochecknoglobals // read-only
)

// settle carries out an operator's settle (events.ActionSettle) of this
// runner's step of d.TripID inside tx: a person did, outside the system,
// what the step keeps failing to do, and says so with d.Outcome.
//
//   - undone, for a step compensating whose undo raised an incident
//     (compensation_stuck, compensation_refused,
//     compensation_answer_mismatch; open or resolved): the step becomes
//     compensated (failed when it was undone for its deadline), its undo
//     event is published (charge.refunded; charge.failed) with
//     settled_by, and no late-commit check follows (the person saw the
//     company's record);
//   - done, for a step pending, started or unknown that raised an
//     incident (forward_stuck, forward_answer_mismatch,
//     company_credentials): the step is done and its done event (with the
//     trip request) published, so the saga goes on;
//   - not_done, for the same, but not a forward-only step (after the
//     pivot only forward): the step failed, its failed event is published
//     and the steps before it are undone.
//
// In each case its retries stop (the row is final), its open incidents
// are resolved with the operator and reason, and a call in flight then
// finds the row changed and records nothing. Anything else is refused with
// why, in the returned effect (the operator log): an unknown outcome, no
// step here, a step already settled by hand (one settle per step, never
// twice), a step that is not stuck, an outcome that does not fit its
// state.
func (r *Runner) settle(ctx context.Context, tx pgx.Tx, d events.OperatorActionData) (string, error) {
	name := r.cfg.Spec.Name
	if !slices.Contains(events.SettleOutcomes, d.Outcome) {
		return fmt.Sprintf("refused: outcome %q is not one of %s", d.Outcome, strings.Join(events.SettleOutcomes, ", ")), nil
	}
	row, err := queries.StepGetForUpdate(ctx, tx, dbsqlc.StepGetForUpdateParams{TripID: d.TripID, Step: name})
	if errors.Is(err, pgx.ErrNoRows) {
		return "refused: no step " + name + " of the trip here: nothing to settle", nil
	}
	if err != nil {
		return "", fmt.Errorf("saga: settle %s of %s: %w", name, d.TripID, err)
	}
	if row.Outcome != nil && strings.HasPrefix(*row.Outcome, settledPrefix) {
		return "refused: step " + name + " is " + row.Status + ", " + *row.Outcome + "; a step is settled once", nil
	}
	kinds, err := queries.IncidentKindsOfStep(ctx, tx, dbsqlc.IncidentKindsOfStepParams{TripID: d.TripID, Step: name})
	if err != nil {
		return "", fmt.Errorf("saga: settle %s of %s: %w", name, d.TripID, err)
	}
	raised := func(family []string) bool {
		return slices.ContainsFunc(kinds, func(k string) bool { return slices.Contains(family, k) })
	}
	now := time.Now()
	what := fmt.Sprintf("%s: %s by %s (%s)", settledPrefix, d.Outcome, d.Operator, d.Reason)
	var typ string
	carry := false
	switch st := Status(row.Status); {
	case st == Compensating:
		if d.Outcome != events.SettleUndone {
			return "refused: step " + name + " is compensating: what is stuck is its undo; settle it " + events.SettleUndone, nil
		}
		if !raised(undoIncidents) {
			return "refused: step " + name + " is compensating, but its undo has raised no incident: it is not stuck (retry_undo calls it now)", nil
		}
		row.UndoneAt, row.VerifyAt = &now, nil
		switch {
		case row.UndoCause != nil && *row.UndoCause == CauseOperator:
			row.Status = string(Compensated) // a leaked record: the operator log is the record
		case row.UndoCause != nil && *row.UndoCause == CauseDeadline:
			row.Status, typ = string(Failed), r.cfg.Spec.OnFailed
		default:
			row.Status, typ = string(Compensated), r.cfg.Spec.OnUndone
		}
	case st == Pending || st == Started || st == Unknown:
		if d.Outcome == events.SettleUndone {
			return "refused: step " + name + " is " + row.Status + " and no undo of it was asked for; settle it " + events.SettleDone + " or " + events.SettleNotDone, nil
		}
		if !raised(forwardIncidents) {
			return "refused: step " + name + " is " + row.Status + ", but it has raised no incident: it is not stuck", nil
		}
		if d.Outcome == events.SettleDone {
			row.Status, typ, carry = string(Done), r.cfg.Spec.OnDone, true
			break
		}
		if r.cfg.Spec.Class == events.ForwardOnly {
			return "refused: step " + name + " is forward-only: after the pivot a trip only goes forward, so it is settled " + events.SettleDone + " or retried", nil
		}
		row.Status, typ = string(Failed), r.cfg.Spec.OnFailed
		row.Reason = new("settled by hand: not done")
	default:
		return "refused: step " + name + " is " + row.Status + ": nothing stuck to settle", nil
	}
	row.Outcome, row.LastError, row.FinishedAt = &what, nil, &now
	if row.Owner != nil && *row.Owner == r.cfg.Liveness.ID() {
		row.Owner = nil
	}
	if err := update(ctx, tx, row); err != nil {
		return "", err
	}
	resolved, err := queries.IncidentResolveStepByOperator(ctx, tx, dbsqlc.IncidentResolveStepByOperatorParams{
		Operator: &d.Operator, Reason: &d.Reason, TripID: d.TripID, Step: name,
	})
	if err != nil {
		return "", fmt.Errorf("saga: settle %s of %s: %w", name, d.TripID, err)
	}
	evs, err := r.eventBy(typ, &row, carry, d.Operator)
	if err != nil {
		return "", err
	}
	if err := outbox.Write(ctx, tx, evs...); err != nil {
		return "", err
	}
	effect := fmt.Sprintf("settled by hand (%s): step %s is %s, its retries stopped, %d incident(s) resolved", d.Outcome, name, row.Status, resolved)
	if typ != "" {
		effect += "; " + events.Kind(typ) + " published"
	}
	r.log.Warn("saga: step settled by hand by an operator", "trip_id", d.TripID, "step", name, "outcome", d.Outcome, "operator", d.Operator, "event", typ)
	return effect, nil
}
