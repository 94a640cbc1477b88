package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/outbox"
	"github.com/tripsaga/tripsaga/process"
	"github.com/tripsaga/tripsaga/reconciler/internal/dbsqlc"
)

// OperatorTokenEnv names the environment variable holding the bearer token
// that operators' actions need (POST /api/actions). Unset, actions are
// disabled (503); reading never needs it.
const OperatorTokenEnv = "OPERATOR_TOKEN"

// Limits of an action request.
const (
	// MaxIdempotencyKeyChars bounds the Idempotency-Key header of an action.
	MaxIdempotencyKeyChars = 200
	// MaxOperatorChars bounds the operator's name; MaxReasonChars the reason.
	MaxOperatorChars = 200
	MaxReasonChars   = 2000
	// maxActionBody bounds the request body, in bytes.
	maxActionBody = 64 << 10
)

// ProblemUnauthorized, ProblemActionsDisabled and ProblemConflict are the
// problem types of the actions API besides app's.
const (
	ProblemUnauthorized    = "https://tripsaga.io/problems/unauthorized"
	ProblemActionsDisabled = "https://tripsaga.io/problems/actions-disabled"
	ProblemConflict        = "https://tripsaga.io/problems/conflict"
)

// ActionRequest is the body of POST /api/actions.
type ActionRequest struct {
	// Action is one of events.OperatorActions.
	Action string `json:"action"`
	// Trip and Service say which trip and which service (hotel, payment,
	// car); a redrive takes both from its dead letter.
	Trip    string `json:"trip,omitempty"`
	Service string `json:"service,omitempty"`
	// Incident is the incident kind to resolve (resolve only; empty
	// resolves every open incident of the trip at Service).
	Incident string `json:"incident,omitempty"`
	// DeadLetterSeq is the DEADLETTER sequence to re-drive (redrive only).
	DeadLetterSeq uint64 `json:"deadletter_seq,omitempty"`
	// Outcome is what a person did outside the system (settle only,
	// required): undone (the stuck undo: the card refunded by hand), done
	// or not_done (a step stuck unknown; not_done never for a step after
	// the pivot). See events.ActionSettle.
	Outcome string `json:"outcome,omitempty"`
	// Step names the step to settle when the service owns several (settle
	// only: "mail" or "traveler_mail" of trips); empty: the service's saga
	// step.
	Step string `json:"step,omitempty"`
	// Reason (why) and Operator (who) are required.
	Reason   string `json:"reason"`
	Operator string `json:"operator"`
}

// OperatorConfig configures an [Operator].
type OperatorConfig struct {
	// Reconciler whose pool, JetStream and projection inboxes it uses.
	// Required.
	Reconciler *Reconciler
	// Token is the bearer token actions need; "" disables them (503).
	Token string
	// Registerer receives the relay's metrics. Optional.
	Registerer prometheus.Registerer
	// Logger defaults to the reconciler's.
	Logger *slog.Logger
}

// Operator is the write side of the operator's console: the actions API
// (each action an io.tripsaga.operator.action.v1 event on the OPERATOR
// stream, recorded in operator_actions and written to the reconciler's
// outbox in one transaction), the dead letters API, and the reconciler's
// own part of carrying actions out (re-drives into its projection).
type Operator struct {
	r     *Reconciler
	token [32]byte
	on    bool
	log   *slog.Logger
	relay *outbox.Relay
	inbox *inbox.Inbox
	// bulkWake wakes the bulk runner (runBulk) when a bulk action is
	// recorded.
	bulkWake chan struct{}
}

// NewOperator builds the actions API, its outbox relay and the inbox that
// carries out re-drives into the reconciler's own consumers.
func NewOperator(cfg OperatorConfig) (*Operator, error) {
	if cfg.Reconciler == nil {
		return nil, fmt.Errorf("%w: OperatorConfig.Reconciler is required", ErrInvalidConfig)
	}
	r := cfg.Reconciler
	if cfg.Logger == nil {
		cfg.Logger = r.log
	}
	o := &Operator{r: r, on: cfg.Token != "", token: sha256.Sum256([]byte(cfg.Token)), log: cfg.Logger, bulkWake: make(chan struct{}, 1)}
	var err error
	o.relay, err = outbox.NewRelay(outbox.RelayConfig{
		Pool: r.cfg.Pool, JetStream: r.cfg.JetStream, Logger: cfg.Logger, Registerer: cfg.Registerer,
		// Only the streams the reconciler owns (OPERATOR), as its NATS
		// identity allows (natsauth).
		EnsureStreams: func(ctx context.Context) error {
			n, _ := events.StreamReplicas()
			return events.EnsureServiceStreams(ctx, r.cfg.JetStream, r.cfg.Catalogue, ProjectionName, n)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("reconciler: operator relay: %w", err)
	}
	o.inbox, err = inbox.New(inbox.Config{
		Name: ProjectionName, Stream: events.StreamOperator,
		FilterSubjects: []string{events.Kind(events.OperatorAction) + ".>"}, Types: []string{events.OperatorAction},
		Pool: r.cfg.Pool, JetStream: r.cfg.JetStream, Handler: o.carryOut, Relay: o.relay,
		Concurrency: 1, Logger: cfg.Logger, Optional: true,
	})
	if err != nil {
		return nil, fmt.Errorf("reconciler: operator inbox: %w", err)
	}
	return o, nil
}

// Inboxes returns the inbox of the operators' actions (optional: the
// reconciler owns OPERATOR and creates it again when lost), for
// readiness (process.Process.AddInboxes).
func (o *Operator) Inboxes() []*inbox.Inbox { return []*inbox.Inbox{o.inbox} }

// Run publishes the recorded actions (the relay), carries out the
// re-drives that name the reconciler and runs the bulk actions
// (sending each trip's action, collecting their outcomes), until ctx ends.
func (o *Operator) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return o.relay.Run(ctx) })
	g.Go(func() error { return o.inbox.Run(ctx) })
	g.Go(func() error { return o.runBulk(ctx) })
	err := g.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// carryOut is the reconciler's handler of operator actions: it re-drives
// a dead letter its own projection parked; every other action is some
// step service's, and is acknowledged without effect here.
func (o *Operator) carryOut(ctx context.Context, tx pgx.Tx, e event.Event) error {
	var d events.OperatorActionData
	if err := events.DecodeData(e, &d); err != nil {
		return err
	}
	if d.Service != ProjectionName || d.Action != events.ActionRedrive {
		return nil
	}
	dup, err := inbox.RedriveParked(ctx, tx, d.DeadLetter, o.r.inboxes...)
	if err != nil {
		return fmt.Errorf("redrive of dead letter %d asked by %s: %w", d.DeadLetter.Seq, d.Operator, err)
	}
	o.log.Info("reconciler: dead letter re-driven into the projection", "seq", d.DeadLetter.Seq, "duplicate", dup, "operator", d.Operator)
	return nil
}

// ActionError is an action refused for what it asks: a field (Status 400,
// Field set), a key reused with another request or an undo_leak without a
// finding (409), a dead letter that does not exist (404).
type ActionError struct {
	Status int
	Field  string
	Detail string
	// Title is the problem's title (RFC 9457); empty: one by Status
	// ("Not found", ...).
	Title string
}

func (e *ActionError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("field %q: %s", e.Field, e.Detail)
	}
	return e.Detail
}

func (e *ActionError) problemType() string {
	switch e.Status {
	case http.StatusNotFound:
		return process.ProblemNotFound
	case http.StatusConflict:
		return ProblemConflict
	}
	return process.ProblemInvalidInput
}

func (e *ActionError) title() string {
	if e.Title != "" {
		return e.Title
	}
	switch e.Status {
	case http.StatusNotFound:
		return "Not found"
	case http.StatusConflict:
		return "The action conflicts with what is recorded"
	}
	return "Invalid action"
}

func bad(field, detail string) error {
	return &ActionError{Status: http.StatusBadRequest, Field: field, Detail: detail}
}

// actionServices are the services of catalogue c that carry out actions
// about a trip.
func actionServices(c events.Catalogue) []string {
	return slices.DeleteFunc(slices.Clone(c.Operator.Consumers), func(s string) bool { return s == ProjectionName })
}

// Act validates ar, records it under key (the audit trail) and writes its
// event to the outbox in one transaction; the relay publishes it right
// after. A key already recorded with the same request returns the same
// event and replayed true, acting once (the event id is the same, so
// JetStream and the services' inboxes drop a second copy); with another
// request it is an [ActionError] 409. Other refusals are [ActionError]s.
func (o *Operator) Act(ctx context.Context, key string, ar ActionRequest) (ev event.Event, replayed bool, err error) {
	ar.Reason, ar.Operator = strings.TrimSpace(ar.Reason), strings.TrimSpace(ar.Operator)
	if !slices.Contains(events.OperatorActions, ar.Action) {
		return ev, false, bad("action", "one of "+strings.Join(events.OperatorActions, ", "))
	}
	switch {
	case ar.Operator == "":
		return ev, false, bad("operator", "required: who asks")
	case len(ar.Operator) > MaxOperatorChars:
		return ev, false, bad("operator", fmt.Sprintf("at most %d characters", MaxOperatorChars))
	case ar.Reason == "":
		return ev, false, bad("reason", "required: why")
	case len(ar.Reason) > MaxReasonChars:
		return ev, false, bad("reason", fmt.Sprintf("at most %d characters", MaxReasonChars))
	}
	d := events.OperatorActionData{Action: ar.Action, TripID: ar.Trip, Service: ar.Service, Incident: ar.Incident,
		Outcome: ar.Outcome, Step: ar.Step, Reason: ar.Reason, Operator: ar.Operator, IdempotencyKey: key}
	if ar.Action == events.ActionRedrive {
		if ar.DeadLetterSeq == 0 {
			return ev, false, bad("deadletter_seq", "required for redrive: the sequence of the dead letter (tripsaga deadletter list)")
		}
		dl, err := o.DeadLetter(ctx, ar.DeadLetterSeq)
		if err != nil {
			return ev, false, err
		}
		if !slices.Contains(o.r.cfg.Catalogue.Operator.Consumers, dl.Consumer) {
			return ev, false, &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf(
				"dead letter %d was parked by consumer %q, which does not take re-drives (those that do: %s)",
				dl.Seq, dl.Consumer, strings.Join(o.r.cfg.Catalogue.Operator.Consumers, ", "))}
		}
		if ar.Service != "" && ar.Service != dl.Consumer {
			return ev, false, bad("service", fmt.Sprintf("dead letter %d was parked by %s; it is re-driven there only", dl.Seq, dl.Consumer))
		}
		d.Service = dl.Consumer
		d.TripID = dl.TripID
		if events.ValidateTripID(d.TripID) != nil {
			d.TripID = "none" // a parked message without a usable trip
		}
		d.DeadLetter = &dl.ParkedEvent
	} else if ar.Action == events.ActionDismiss {
		if err := o.dismissable(ctx, key, ar); err != nil {
			return ev, false, err
		}
		d.Service, d.Finding, d.TripID = ProjectionName, ar.Trip, ar.Trip
		if events.ValidateTripID(ar.Trip) != nil {
			d.TripID = "none" // an unattributed record's finding
		}
	} else {
		if ar.Trip == "" {
			return ev, false, bad("trip", "required: a trip id (T-...)")
		}
		if err := events.ValidateTripID(ar.Trip); err != nil {
			return ev, false, bad("trip", fmt.Sprintf("%q is not a trip id (T-...): no spaces, dots, * or >", ar.Trip))
		}
		if svcs := actionServices(o.r.cfg.Catalogue); !slices.Contains(svcs, ar.Service) {
			return ev, false, bad("service", "one of "+strings.Join(svcs, ", "))
		}
		if ar.Incident != "" && ar.Action != events.ActionResolve {
			return ev, false, bad("incident", "only for resolve")
		}
		if ar.Action != events.ActionUndoLeak && ar.Action != events.ActionSettle {
			if err := o.knownTarget(ctx, key, ar); err != nil {
				return ev, false, err
			}
		}
	}
	if ar.DeadLetterSeq != 0 && ar.Action != events.ActionRedrive {
		return ev, false, bad("deadletter_seq", "only for redrive")
	}
	if ar.Action != events.ActionSettle && (ar.Outcome != "" || ar.Step != "") {
		field := "outcome"
		if ar.Outcome == "" {
			field = "step"
		}
		return ev, false, bad(field, "only for settle")
	}
	if ar.Action == events.ActionSettle {
		step, err := o.settleable(ctx, key, ar)
		if err != nil {
			return ev, false, err
		}
		d.Step = step // named always, so two settles of one step are seen as one
	}
	if ar.Action == events.ActionUndoLeak {
		rows, err := queries.FindingListByTrip(ctx, o.r.cfg.Pool, ar.Trip)
		if err != nil {
			return ev, false, fmt.Errorf("findings of %s: %w", ar.Trip, err)
		}
		if !slices.ContainsFunc(rows, func(f dbsqlc.Finding) bool {
			return f.ResolvedAt == nil && (f.Kind == FindingOrphan || f.Kind == FindingHalf)
		}) {
			return ev, false, &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf(
				"trip %s has no open orphan or half finding: undo_leak undoes only a record the sweep found in force where it should not be", ar.Trip)}
		}
	}
	fp, err := json.Marshal(ar)
	if err != nil {
		return ev, false, err
	}
	sum := sha256.Sum256(fp)
	fingerprint := hex.EncodeToString(sum[:])

	for range 3 {
		var also func(context.Context, pgx.Tx) error
		if ar.Action == events.ActionDismiss {
			also = func(ctx context.Context, tx pgx.Tx) error {
				_, err := queries.FindingDismiss(ctx, tx, dbsqlc.FindingDismissParams{Now: time.Now(), Operator: d.Operator, Reason: d.Reason, TripID: ar.Trip, Kind: ar.Incident})
				return err
			}
		}
		if ev, replayed, err = o.record(ctx, key, fingerprint, d, ar.DeadLetterSeq, also); err == nil || !errors.Is(err, errRaced) {
			return ev, replayed, err
		}
	}
	return ev, false, err
}

// errRaced: another request with the key committed between our look-up
// and our insert; look again.
var errRaced = errors.New("idempotency key raced")

// record records the action d under key with its event, and also, when
// set, runs in the same transaction (the reconciler's own part: a
// finding dismissed).
func (o *Operator) record(ctx context.Context, key, fingerprint string, d events.OperatorActionData, dlSeq uint64, also func(context.Context, pgx.Tx) error) (event.Event, bool, error) {
	var ev event.Event
	prev, err := queries.OperatorActionGetByKey(ctx, o.r.cfg.Pool, key)
	if err == nil {
		if prev.Fingerprint != fingerprint {
			return ev, false, &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf(
				"Idempotency-Key %q was used at %s for another action (%s of %s at %s by %s); use a new key for a new action",
				key, prev.CreatedAt.UTC().Format(time.RFC3339), prev.Action, prev.TripID, prev.Service, prev.Operator)}
		}
		if err := json.Unmarshal(prev.Event, &ev); err != nil {
			return ev, false, fmt.Errorf("action %s: stored event: %w", prev.EventID, err)
		}
		return ev, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return ev, false, fmt.Errorf("action by key: %w", err)
	}
	if rows, err := queries.OperatorActionListByKeyPrefix(ctx, o.r.cfg.Pool, key+"/"); err != nil {
		return ev, false, fmt.Errorf("actions by key: %w", err)
	} else if len(rows) > 0 {
		return ev, false, &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf(
			"Idempotency-Key %q was used at %s for a re-drive of %s from a step (by %s); use a new key for a new action",
			key, rows[0].CreatedAt.UTC().Format(time.RFC3339), rows[0].TripID, rows[0].Operator)}
	}
	err = outbox.UnitOfWork{Pool: o.r.cfg.Pool, Relay: o.relay}.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if ev, err = recordIn(ctx, tx, key, fingerprint, d, dlSeq); err != nil {
			return err
		}
		if also != nil {
			return also(ctx, tx)
		}
		return nil
	})
	if errors.Is(err, errRaced) {
		return ev, false, errRaced
	}
	if err != nil {
		return ev, false, fmt.Errorf("record action: %w", err)
	}
	o.log.Info("reconciler: operator action recorded", "action", d.Action, "trip_id", d.TripID, "service", d.Service,
		"operator", d.Operator, "event_id", ev.ID())
	return ev, false, nil
}

// recordIn builds the event of action d and, inside tx, records it under
// key in operator_actions and writes it to the outbox; errRaced when the
// key is recorded already (another request committed it meanwhile).
func recordIn(ctx context.Context, tx pgx.Tx, key, fingerprint string, d events.OperatorActionData, dlSeq uint64) (event.Event, error) {
	ev, err := events.New(events.Source(ProjectionName), events.OperatorAction, d.TripID, d)
	if err != nil {
		return ev, err
	}
	stored, err := json.Marshal(ev)
	if err != nil {
		return ev, err
	}
	seq := pgtype.Int8{Int64: int64(dlSeq), Valid: dlSeq != 0}
	n, err := queries.OperatorActionInsert(ctx, tx, dbsqlc.OperatorActionInsertParams{
		EventID: ev.ID(), IdempotencyKey: key, Fingerprint: fingerprint, Action: d.Action, TripID: d.TripID,
		Service: d.Service, Operator: d.Operator, Reason: d.Reason, DeadletterSeq: seq, Event: stored, CreatedAt: ev.Time(),
	})
	if err != nil {
		return ev, fmt.Errorf("record action: %w", err)
	}
	if n == 0 {
		return ev, errRaced
	}
	if err := outbox.Write(ctx, tx, ev); err != nil {
		return ev, fmt.Errorf("action event: %w", err)
	}
	return ev, nil
}

// Actions returns the recorded action events, newest first: of one trip
// when trip is not "", at most limit.
func (o *Operator) Actions(ctx context.Context, trip string, limit int) ([]event.Event, error) {
	rows, err := queries.OperatorActionList(ctx, o.r.cfg.Pool, dbsqlc.OperatorActionListParams{TripID: trip, Max: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("actions: %w", err)
	}
	out := make([]event.Event, 0, len(rows))
	for _, row := range rows {
		var e event.Event
		if err := json.Unmarshal(row.Event, &e); err != nil {
			return nil, fmt.Errorf("action %s: %w", row.EventID, err)
		}
		out = append(out, e)
	}
	return out, nil
}
