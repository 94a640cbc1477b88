package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oklog/ulid/v2"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/reconciler/internal/dbsqlc"
)

// Bulk action limits.
const (
	// MaxBulkTrips bounds the trips one bulk action takes: a filter that
	// matches more is refused (narrow it, or run several).
	MaxBulkTrips = 10000
	// MaxBulkRate bounds rate_per_s, actions per second per company.
	MaxBulkRate = 1000
	// bulkSample is how many trips a dry run shows.
	bulkSample = 10
	// bulkPassEvery is how often the bulk runner looks for work.
	bulkPassEvery = 250 * time.Millisecond
)

// BulkActions are the actions a bulk action can apply: those about one
// trip at one service that need nothing but the trip, and redrive: a
// re-drive of each trip from a step ([Operator.RedriveFrom]).
var BulkActions = []string{events.ActionRetryUndo, events.ActionPause, events.ActionResume, events.ActionResolve, events.ActionSettle, events.ActionRedrive} //nolint:gochecknoglobals // read-only

// Bulk action states (bulk_actions.state) and its trips' (bulk_action_trips.state).
const (
	BulkCanary   = "canary"
	BulkRunning  = "running"
	BulkDone     = "done"
	BulkStopped  = "stopped"
	BulkCanceled = "canceled"

	// A trip is skipped when it was not sent (canceled, the canary
	// failed, nobody to carry it out) or its action found nothing left
	// to do (the step finished meanwhile); failed when it was refused.
	BulkTripWaiting = "waiting"
	BulkTripSent    = "sent"
	BulkTripDone    = "done"
	BulkTripFailed  = "failed"
	BulkTripSkipped = "skipped"
)

// bulkTripStates lists a bulk action's trips' states, in the order of
// their way.
var bulkTripStates = []string{BulkTripWaiting, BulkTripSent, BulkTripDone, BulkTripFailed, BulkTripSkipped} //nolint:gochecknoglobals // read-only

// BulkRequest is the body of POST /api/bulk-actions: an action (one of
// [BulkActions]) for every trip Filter matches.
type BulkRequest struct {
	Action string `json:"action"`
	// Service carries the action out for every trip; "" (the default):
	// each trip's open step's company (open_steps), and a trip with no
	// unfinished step is skipped.
	Service string `json:"service,omitempty"`
	// Incident (resolve), Outcome and Step (settle) as in [ActionRequest];
	// for redrive, Step is the step to re-drive each trip from (required).
	Incident string     `json:"incident,omitempty"`
	Outcome  string     `json:"outcome,omitempty"`
	Step     string     `json:"step,omitempty"`
	Filter   TripFilter `json:"filter"`
	// DryRun counts the trips and shows a sample; nothing is recorded.
	DryRun bool `json:"dry_run,omitempty"`
	// ExpectedCount is the count the operator confirmed (a dry run's);
	// required to run: a filter that matches another count now is
	// refused (409), so the set cannot grow behind the operator.
	ExpectedCount *int `json:"expected_count,omitempty"`
	// RatePerS bounds the actions sent per second to each company's
	// service (0: no limit; at most [MaxBulkRate]).
	RatePerS float64 `json:"rate_per_s,omitempty"`
	// Canary sends the first Canary trips only, waits for what their
	// services report, and stops the bulk action if any failed.
	Canary   int    `json:"canary,omitempty"`
	Reason   string `json:"reason"`
	Operator string `json:"operator"`
}

// BulkTrip is one trip of a bulk action and where its action is.
type BulkTrip struct {
	TripID  string `json:"trip_id"`
	Service string `json:"service"`
	// State is waiting, sent, done, failed or skipped.
	State string `json:"state"`
	// EventID is the trip's operator action (GET /api/actions/{id}/outcome).
	EventID    string     `json:"event_id,omitempty"`
	Effect     string     `json:"effect,omitempty"`
	SentAt     *time.Time `json:"sent_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// BulkDryRun is what a bulk action would take.
type BulkDryRun struct {
	Action string     `json:"action"`
	Filter TripFilter `json:"filter"`
	// Count is the trips the filter matches now: the expected_count to
	// confirm. ByService counts them by who would carry the action out
	// ("" for the trips that would be skipped: no unfinished step).
	Count     int            `json:"count"`
	ByService map[string]int `json:"by_service"`
	Sample    []BulkTrip     `json:"sample"`
}

// BulkAction is a bulk action's audit record and progress.
type BulkAction struct {
	ID          string     `json:"id"`
	Action      string     `json:"action"`
	Service     string     `json:"service,omitempty"`
	Incident    string     `json:"incident,omitempty"`
	Outcome     string     `json:"outcome,omitempty"`
	Step        string     `json:"step,omitempty"`
	Filter      TripFilter `json:"filter"`
	Trips       int        `json:"trips"`
	RatePerS    float64    `json:"rate_per_s"`
	Canary      int        `json:"canary"`
	Operator    string     `json:"operator"`
	Reason      string     `json:"reason"`
	State       string     `json:"state"`
	StateReason string     `json:"state_reason,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	// Counts are its trips by state (waiting, sent, done, failed,
	// skipped); Items its trips in sending order (the first 1000).
	Counts map[string]int `json:"counts"`
	Items  []BulkTrip     `json:"items,omitempty"`
}

// Ended reports whether the bulk action sends nothing more and every
// sent trip's outcome is in.
func (b BulkAction) Ended() bool { return b.FinishedAt != nil && b.Counts[BulkTripSent] == 0 }

func bulkOf(row dbsqlc.BulkAction) (BulkAction, error) {
	b := BulkAction{ID: row.ID, Action: row.Action, Service: row.Service, Incident: row.Incident, Outcome: row.Outcome, Step: row.Step,
		Trips: int(row.Trips), RatePerS: row.RatePerS, Canary: int(row.Canary), Operator: row.Operator, Reason: row.Reason,
		State: row.State, StateReason: row.StateReason, CreatedAt: row.CreatedAt.UTC(), FinishedAt: row.FinishedAt, Counts: map[string]int{}}
	if err := json.Unmarshal(row.Filter, &b.Filter); err != nil {
		return b, fmt.Errorf("bulk action %s: filter: %w", row.ID, err)
	}
	return b, nil
}

func bulkTripOf(t dbsqlc.BulkActionTrip) BulkTrip {
	return BulkTrip{TripID: t.TripID, Service: t.Service, State: t.State, EventID: deref(t.EventID), Effect: t.Effect,
		SentAt: t.SentAt, FinishedAt: t.FinishedAt}
}

// validate checks br's fields; an [ActionError] 400 names the field.
func (o *Operator) validateBulk(br *BulkRequest) error {
	br.Reason, br.Operator = strings.TrimSpace(br.Reason), strings.TrimSpace(br.Operator)
	switch {
	case !slices.Contains(BulkActions, br.Action):
		return bad("action", "one of "+strings.Join(BulkActions, ", ")+" (a bulk action applies one to every trip)")
	case br.Service != "" && !slices.Contains(actionServices(o.r.cfg.Catalogue), br.Service):
		return bad("service", "one of "+strings.Join(actionServices(o.r.cfg.Catalogue), ", ")+", or empty: each trip's open step's company")
	case br.RatePerS < 0 || br.RatePerS > MaxBulkRate || math.IsNaN(br.RatePerS):
		return bad("rate_per_s", fmt.Sprintf("actions per second per company, 0 (no limit) to %d", MaxBulkRate))
	case br.Canary < 0:
		return bad("canary", "0 (none) or the trips to send first")
	case br.Action == events.ActionSettle && !slices.Contains(events.SettleOutcomes, br.Outcome):
		return bad("outcome", "required for settle: one of "+strings.Join(events.SettleOutcomes, ", "))
	case br.Action == events.ActionRedrive && br.Step != "" && !slices.Contains(stepsOfEveryVersion(o.r.cfg.Catalogue), br.Step):
		return bad("step", "one of "+strings.Join(stepsOfEveryVersion(o.r.cfg.Catalogue), ", ")+": the step to re-drive each trip from")
	case br.Action != events.ActionSettle && br.Outcome != "":
		return bad("outcome", "only for settle")
	case br.Action == events.ActionRedrive && br.Step == "":
		return bad("step", "required for redrive: the step to re-drive each trip's events from (hotel, payment, car, ...)")
	case br.Action == events.ActionRedrive && br.Service != "":
		return bad("service", "not for redrive: each event goes to every service that consumes it")
	case br.Action != events.ActionSettle && br.Action != events.ActionRedrive && br.Step != "":
		return bad("step", "only for settle and redrive")
	case br.Action != events.ActionResolve && br.Incident != "":
		return bad("incident", "only for resolve")
	case br.DryRun:
		return nil
	case br.ExpectedCount == nil || *br.ExpectedCount < 0:
		return bad("expected_count", "required: the count of a dry run of this filter, confirmed (0 or more)")
	case br.Operator == "":
		return bad("operator", "required: who asks")
	case len(br.Operator) > MaxOperatorChars:
		return bad("operator", fmt.Sprintf("at most %d characters", MaxOperatorChars))
	case br.Reason == "":
		return bad("reason", "required: why")
	case len(br.Reason) > MaxReasonChars:
		return bad("reason", fmt.Sprintf("at most %d characters", MaxReasonChars))
	}
	return nil
}

// selectBulk returns the trips f matches for a bulk action, oldest first,
// each with who would carry the action out ("" when nobody: no service
// given and no unfinished step). More than [MaxBulkTrips] is an
// [ActionError] 400.
func (o *Operator) selectBulk(ctx context.Context, br BulkRequest) ([]BulkTrip, error) {
	var rows []dbsqlc.TripListSelectRow
	err := o.r.readList(ctx, func(tx pgx.Tx) error {
		p := br.Filter.countParams()
		var err error
		rows, err = queries.TripListSelect(ctx, tx, dbsqlc.TripListSelectParams{Status: p.Status, Version: p.Version, FromAt: p.FromAt,
			ToAt: p.ToAt, MinAgeMs: p.MinAgeMs, Step: p.Step, State: p.State, Company: p.Company, MinAttempts: p.MinAttempts,
			Error: p.Error, Paused: p.Paused, Finding: p.Finding, Max: MaxBulkTrips + 1})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reconciler: bulk selection: %w", err)
	}
	if len(rows) > MaxBulkTrips {
		return nil, bad("filter", fmt.Sprintf("matches more than %d trips; narrow it (a bulk action takes at most %d)", MaxBulkTrips, MaxBulkTrips))
	}
	out := make([]BulkTrip, 0, len(rows))
	for _, row := range rows {
		t := BulkTrip{TripID: row.TripID, Service: row.OpenService, State: BulkTripWaiting}
		if br.Service != "" {
			t.Service = br.Service
		}
		if br.Action == events.ActionRedrive {
			t.Service = "every consumer"
		}
		if t.Service == "" {
			t.State, t.Effect = BulkTripSkipped, "no unfinished step to name its company, and no service given"
		}
		out = append(out, t)
	}
	return out, nil
}

// DryRunBulk counts and samples what br would act on; it records nothing.
func (o *Operator) DryRunBulk(ctx context.Context, br BulkRequest) (BulkDryRun, error) {
	br.DryRun = true
	if err := o.validateBulk(&br); err != nil {
		return BulkDryRun{}, err
	}
	trips, err := o.selectBulk(ctx, br)
	if err != nil {
		return BulkDryRun{}, err
	}
	d := BulkDryRun{Action: br.Action, Filter: br.Filter, Count: len(trips), ByService: map[string]int{}, Sample: trips[:min(len(trips), bulkSample)]}
	for _, t := range trips {
		d.ByService[t.Service]++
	}
	return d, nil
}

// StartBulk records the bulk action br under key with its trips (the
// filter's now, which must be br.ExpectedCount many: else an
// [ActionError] 409) and returns it; the bulk runner then sends each
// trip's action. The same key with the same request returns the same
// bulk action (replayed); with another request it is a 409.
func (o *Operator) StartBulk(ctx context.Context, key string, br BulkRequest) (BulkAction, bool, error) {
	if err := o.validateBulk(&br); err != nil {
		return BulkAction{}, false, err
	}
	if br.DryRun {
		return BulkAction{}, false, bad("dry_run", "a dry run records nothing: use DryRunBulk")
	}
	fp, err := json.Marshal(br)
	if err != nil {
		return BulkAction{}, false, err
	}
	sum := sha256.Sum256(fp)
	fingerprint := hex.EncodeToString(sum[:])
	for range 3 {
		prev, err := queries.BulkGetByKey(ctx, o.r.cfg.Pool, key)
		if err == nil {
			if prev.Fingerprint != fingerprint {
				return BulkAction{}, false, &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf(
					"Idempotency-Key %q was used at %s for another bulk action (%s, %s); use a new key for a new one",
					key, prev.CreatedAt.UTC().Format(time.RFC3339), prev.ID, prev.Action)}
			}
			b, err := o.Bulk(ctx, prev.ID, 0)
			return b, true, err
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return BulkAction{}, false, fmt.Errorf("bulk action by key: %w", err)
		}
		trips, err := o.selectBulk(ctx, br)
		if err != nil {
			return BulkAction{}, false, err
		}
		if len(trips) != *br.ExpectedCount {
			return BulkAction{}, false, &ActionError{Status: http.StatusConflict, Field: "expected_count", Detail: fmt.Sprintf(
				"the filter matches %d trips now, not the %d confirmed: dry-run it again and confirm the new count", len(trips), *br.ExpectedCount)}
		}
		id := "B-" + ulid.Make().String()
		filter, err := json.Marshal(br.Filter)
		if err != nil {
			return BulkAction{}, false, err
		}
		state := BulkRunning
		if br.Canary > 0 {
			state = BulkCanary
		}
		raced := false
		err = pgx.BeginFunc(ctx, o.r.cfg.Pool, func(tx pgx.Tx) error {
			n, err := queries.BulkInsert(ctx, tx, dbsqlc.BulkInsertParams{ID: id, IdempotencyKey: key, Fingerprint: fingerprint,
				Action: br.Action, Service: br.Service, Incident: br.Incident, Outcome: br.Outcome, Step: br.Step, Filter: filter,
				Trips: int32(len(trips)), RatePerS: br.RatePerS, Canary: int32(br.Canary), Operator: br.Operator, Reason: br.Reason, State: state})
			if err != nil {
				return err
			}
			if raced = n == 0; raced {
				return nil
			}
			p := dbsqlc.BulkTripInsertManyParams{BulkID: id}
			for i, t := range trips {
				p.TripIds = append(p.TripIds, t.TripID)
				p.Positions = append(p.Positions, int32(i))
				p.Services = append(p.Services, t.Service)
				p.States = append(p.States, t.State)
				p.Effects = append(p.Effects, t.Effect)
			}
			if err := queries.BulkTripInsertMany(ctx, tx, p); err != nil {
				return err
			}
			if len(trips) == 0 || !slices.ContainsFunc(trips, func(t BulkTrip) bool { return t.State == BulkTripWaiting }) {
				return queries.BulkSetState(ctx, tx, dbsqlc.BulkSetStateParams{ID: id, State: BulkDone, StateReason: "nothing to send", Finished: true})
			}
			return nil
		})
		if err != nil {
			return BulkAction{}, false, fmt.Errorf("record bulk action: %w", err)
		}
		if raced {
			continue // another request with the key committed first
		}
		o.log.Info("reconciler: bulk action recorded", "id", id, "action", br.Action, "trips", len(trips), "operator", br.Operator,
			"rate_per_s", br.RatePerS, "canary", br.Canary)
		o.wakeBulk()
		b, err := o.Bulk(ctx, id, 0)
		return b, false, err
	}
	return BulkAction{}, false, errRaced
}

// Bulk returns bulk action id with its counts and its first items trips
// (0: none); an [ActionError] 404 when there is none.
func (o *Operator) Bulk(ctx context.Context, id string, items int) (BulkAction, error) {
	if !validBulkID(id) {
		return BulkAction{}, &ActionError{Status: http.StatusNotFound, Detail: fmt.Sprintf("no bulk action %q: its ids are B-<ULID>", id)}
	}
	row, err := queries.BulkGet(ctx, o.r.cfg.Pool, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return BulkAction{}, &ActionError{Status: http.StatusNotFound, Detail: fmt.Sprintf("no bulk action %q", id)}
	}
	if err != nil {
		return BulkAction{}, fmt.Errorf("bulk action %s: %w", id, err)
	}
	b, err := bulkOf(row)
	if err != nil {
		return b, err
	}
	counts, err := queries.BulkTripCounts(ctx, o.r.cfg.Pool, id)
	if err != nil {
		return b, fmt.Errorf("bulk action %s: %w", id, err)
	}
	for _, c := range counts {
		b.Counts[c.State] = int(c.Trips)
	}
	if items > 0 {
		ts, err := queries.BulkTripList(ctx, o.r.cfg.Pool, dbsqlc.BulkTripListParams{BulkID: id, Max: int32(items)})
		if err != nil {
			return b, fmt.Errorf("bulk action %s: %w", id, err)
		}
		for _, t := range ts {
			b.Items = append(b.Items, bulkTripOf(t))
		}
	}
	return b, nil
}

// validBulkID reports whether id can be a bulk action's: "B-" and a ULID.
func validBulkID(id string) bool {
	u, ok := strings.CutPrefix(id, "B-")
	_, err := ulid.ParseStrict(u)
	return ok && err == nil
}

// Bulks returns the newest bulk actions, at most limit, with their counts.
func (o *Operator) Bulks(ctx context.Context, limit int) ([]BulkAction, error) {
	rows, err := queries.BulkList(ctx, o.r.cfg.Pool, int32(limit))
	if err != nil {
		return nil, fmt.Errorf("bulk actions: %w", err)
	}
	out := make([]BulkAction, 0, len(rows))
	for _, row := range rows {
		b, err := o.Bulk(ctx, row.ID, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// CancelBulk stops bulk action id: the trips not sent yet are skipped;
// those sent keep their actions (each is recorded and will be carried
// out) and their outcomes are still collected. A bulk action that ended
// already is an [ActionError] 409.
func (o *Operator) CancelBulk(ctx context.Context, id, operator, reason string) (BulkAction, error) {
	operator, reason = strings.TrimSpace(operator), strings.TrimSpace(reason)
	if !validBulkID(id) {
		return BulkAction{}, &ActionError{Status: http.StatusNotFound, Detail: fmt.Sprintf("no bulk action %q: its ids are B-<ULID>", id)}
	}
	if operator == "" || len(operator) > MaxOperatorChars {
		return BulkAction{}, bad("operator", "required: who cancels")
	}
	if reason == "" || len(reason) > MaxReasonChars {
		return BulkAction{}, bad("reason", "required: why")
	}
	err := pgx.BeginFunc(ctx, o.r.cfg.Pool, func(tx pgx.Tx) error {
		var state string
		var finished *time.Time
		err := tx.QueryRow(ctx, "SELECT state, finished_at FROM bulk_actions WHERE id = $1 FOR UPDATE", id).Scan(&state, &finished)
		if errors.Is(err, pgx.ErrNoRows) {
			return &ActionError{Status: http.StatusNotFound, Detail: fmt.Sprintf("no bulk action %q", id)}
		}
		if err != nil {
			return err
		}
		if finished != nil {
			return &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf("bulk action %s ended already (%s)", id, state)}
		}
		if _, err := queries.BulkTripSkipWaiting(ctx, tx, dbsqlc.BulkTripSkipWaitingParams{BulkID: id, Effect: "canceled before it was sent"}); err != nil {
			return err
		}
		return queries.BulkSetState(ctx, tx, dbsqlc.BulkSetStateParams{ID: id, State: BulkCanceled,
			StateReason: fmt.Sprintf("canceled by %s: %s", operator, reason), Finished: true})
	})
	var ae *ActionError
	if errors.As(err, &ae) {
		return BulkAction{}, err
	}
	if err != nil {
		return BulkAction{}, fmt.Errorf("cancel bulk action %s: %w", id, err)
	}
	o.log.Info("reconciler: bulk action canceled", "id", id, "operator", operator)
	return o.Bulk(ctx, id, 0)
}

// wakeBulk makes the bulk runner look for work now.
func (o *Operator) wakeBulk() {
	select {
	case o.bulkWake <- struct{}{}:
	default:
	}
}

// runBulk sends the bulk actions' trips and collects their outcomes,
// every [bulkPassEvery] (and at once when one is recorded here), until
// ctx ends. Replicas share the work: each pass locks the bulk actions it
// advances (SKIP LOCKED), and the rate limit counts from the database.
func (o *Operator) runBulk(ctx context.Context) error {
	t := time.NewTicker(bulkPassEvery)
	defer t.Stop()
	for {
		if err := o.bulkPass(ctx); err != nil && ctx.Err() == nil {
			o.log.Warn("reconciler: bulk pass", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-o.bulkWake:
		}
	}
}

// bulkPass advances every bulk action with work left once.
func (o *Operator) bulkPass(ctx context.Context) error {
	return pgx.BeginFunc(ctx, o.r.cfg.Pool, func(tx pgx.Tx) error {
		rows, err := queries.BulkClaimActive(ctx, tx)
		if err != nil {
			return err
		}
		for _, row := range rows {
			if err := o.advance(ctx, tx, row); err != nil {
				return fmt.Errorf("bulk action %s: %w", row.ID, err)
			}
		}
		return nil
	})
}

// advance collects the outcomes of b's sent trips, sends what the rate
// limit and the canary allow, and moves b's state on.
func (o *Operator) advance(ctx context.Context, tx pgx.Tx, b dbsqlc.BulkAction) error {
	sent, err := queries.BulkTripsSent(ctx, tx, dbsqlc.BulkTripsSentParams{BulkID: b.ID, Max: 500})
	if err != nil {
		return err
	}
	for _, t := range sent {
		out, err := o.Outcome(ctx, deref(t.EventID))
		if err != nil || !out.Reported {
			continue // not carried out yet (or not readable): asked again next pass
		}
		state := BulkTripDone
		switch {
		case strings.HasPrefix(out.Effect, "refused"):
			state = BulkTripFailed
		case !out.Done:
			state = BulkTripSkipped // nothing left to do there: it finished meanwhile
		}
		if err := queries.BulkTripFinish(ctx, tx, dbsqlc.BulkTripFinishParams{BulkID: b.ID, TripID: t.TripID, State: state, Effect: out.Effect}); err != nil {
			return err
		}
	}
	if b.FinishedAt != nil {
		return nil // canceled, stopped or done: only outcomes are collected
	}
	below := int32(math.MaxInt32)
	if b.State == BulkCanary {
		below = b.Canary
	}
	allowed, err := o.rateAllows(ctx, tx, b)
	if err != nil {
		return err
	}
	waiting, err := queries.BulkTripsWaiting(ctx, tx, dbsqlc.BulkTripsWaitingParams{BulkID: b.ID, Below: below, Max: 200})
	if err != nil {
		return err
	}
	for _, t := range waiting {
		if n, limited := allowed[t.Service]; limited && n <= 0 {
			continue
		}
		if b.Action == events.ActionRedrive {
			if err := o.sendRedrive(ctx, tx, b, t); err != nil {
				return err
			}
			continue
		}
		ev, _, err := o.Act(ctx, b.IdempotencyKey+"/"+t.TripID, ActionRequest{Action: b.Action, Trip: t.TripID, Service: t.Service,
			Incident: b.Incident, Outcome: b.Outcome, Step: b.Step, Reason: fmt.Sprintf("bulk action %s: %s", b.ID, b.Reason), Operator: b.Operator})
		var ae *ActionError
		switch {
		case errors.As(err, &ae) && ae.Status == http.StatusConflict:
			// Nothing to act on any more (the step finished meanwhile,
			// the incident was resolved): not the action's failure.
			err = queries.BulkTripFinish(ctx, tx, dbsqlc.BulkTripFinishParams{BulkID: b.ID, TripID: t.TripID, State: BulkTripSkipped, Effect: "nothing to do: " + ae.Error()})
		case errors.As(err, &ae):
			err = queries.BulkTripFinish(ctx, tx, dbsqlc.BulkTripFinishParams{BulkID: b.ID, TripID: t.TripID, State: BulkTripFailed, Effect: "refused: " + ae.Error()})
		case err != nil:
			o.log.Warn("reconciler: bulk action: send", "id", b.ID, "trip_id", t.TripID, "err", err)
			continue // sent again next pass, by the same key
		default:
			id := ev.ID()
			err = queries.BulkTripSent(ctx, tx, dbsqlc.BulkTripSentParams{BulkID: b.ID, TripID: t.TripID, EventID: &id})
		}
		if err != nil {
			return err
		}
		if _, limited := allowed[t.Service]; limited {
			allowed[t.Service]--
		}
	}
	return o.moveOn(ctx, tx, b)
}

// sendRedrive re-drives trip t of bulk action b from b's step
// ([Operator.RedriveFrom], under the key "<key>/<trip>"): done once its
// deliveries are recorded (each consumer's inbox then takes or drops its
// event; the trip's timeline shows which), failed when it is refused.
// Not limited by the rate: its deliveries go to every consumer at once.
func (o *Operator) sendRedrive(ctx context.Context, tx pgx.Tx, b dbsqlc.BulkAction, t dbsqlc.BulkActionTrip) error {
	plan, err := o.RedriveFrom(ctx, b.IdempotencyKey+"/"+t.TripID, RedriveFromRequest{Trip: t.TripID, Step: b.Step,
		Operator: b.Operator, Reason: fmt.Sprintf("bulk action %s: %s", b.ID, b.Reason)})
	var ae *ActionError
	state, effect := BulkTripDone, ""
	switch {
	case errors.As(err, &ae):
		state, effect = BulkTripFailed, "refused: "+ae.Error()
	case err != nil:
		o.log.Warn("reconciler: bulk action: redrive", "id", b.ID, "trip_id", t.TripID, "err", err)
		return nil // sent again next pass, by the same key
	default:
		effect = fmt.Sprintf("%d deliveries from %s recorded (%d skipped)", len(plan.Deliveries), plan.Step, len(plan.Skipped))
	}
	return queries.BulkTripFinish(ctx, tx, dbsqlc.BulkTripFinishParams{BulkID: b.ID, TripID: t.TripID, State: state, Effect: effect})
}

// rateAllows returns, when b has a rate limit, how many more actions each
// company's service may be sent now: rate × window less those sent in the
// window, the window one second (or 1/rate s when the rate is below one
// a second). A service missing from the map is not limited.
func (o *Operator) rateAllows(ctx context.Context, tx pgx.Tx, b dbsqlc.BulkAction) (map[string]int, error) {
	allowed := map[string]int{}
	if b.RatePerS <= 0 {
		return allowed, nil
	}
	window := max(time.Second, time.Duration(float64(time.Second)/b.RatePerS))
	var now time.Time
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return nil, err
	}
	counts, err := queries.BulkSentSince(ctx, tx, dbsqlc.BulkSentSinceParams{BulkID: b.ID, Since: now.Add(-window)})
	if err != nil {
		return nil, err
	}
	per := int(math.Floor(b.RatePerS * window.Seconds()))
	for _, s := range actionServices(o.r.cfg.Catalogue) {
		allowed[s] = per
	}
	for _, c := range counts {
		allowed[c.Service] = per - int(c.Sent)
	}
	return allowed, nil
}

// moveOn ends the canary (stopped when any canary trip failed) and the
// bulk action (done when nothing is waiting or sent).
func (o *Operator) moveOn(ctx context.Context, tx pgx.Tx, b dbsqlc.BulkAction) error {
	rows, err := queries.BulkTripCounts(ctx, tx, b.ID)
	if err != nil {
		return err
	}
	c := map[string]int{}
	for _, r := range rows {
		c[r.State] = int(r.Trips)
	}
	set := func(state, why string, finished bool) error {
		o.log.Info("reconciler: bulk action "+state, "id", b.ID, "why", why)
		return queries.BulkSetState(ctx, tx, dbsqlc.BulkSetStateParams{ID: b.ID, State: state, StateReason: why, Finished: finished})
	}
	if b.State == BulkCanary && c[BulkTripSent] == 0 {
		// Every trip sent so far is a canary trip; are they all in?
		waitingCanary, err := queries.BulkTripsWaiting(ctx, tx, dbsqlc.BulkTripsWaitingParams{BulkID: b.ID, Below: b.Canary, Max: 1})
		if err != nil {
			return err
		}
		if len(waitingCanary) == 0 {
			if c[BulkTripFailed] > 0 {
				if _, err := queries.BulkTripSkipWaiting(ctx, tx, dbsqlc.BulkTripSkipWaitingParams{BulkID: b.ID, Effect: "not sent: the canary failed"}); err != nil {
					return err
				}
				return set(BulkStopped, fmt.Sprintf("the canary failed: %d of the first %d trips failed; the others were not sent", c[BulkTripFailed], b.Canary), true)
			}
			if c[BulkTripWaiting] > 0 {
				return set(BulkRunning, fmt.Sprintf("the canary passed: the first %d trips done", min(int(b.Canary), c[BulkTripDone])), false)
			}
		}
	}
	if c[BulkTripWaiting] == 0 && c[BulkTripSent] == 0 {
		return set(BulkDone, fmt.Sprintf("%d done, %d failed, %d skipped", c[BulkTripDone], c[BulkTripFailed], c[BulkTripSkipped]), true)
	}
	return nil
}
