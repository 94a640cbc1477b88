package reconciler

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/outbox"
)

// maxRedriveEvents bounds the events of one trip a re-drive from a step
// reads on one stream (a trip has a few dozen).
const maxRedriveEvents = timelineMaxEvents

// RedriveFromRequest is a re-drive of a trip from a step: the body of
// POST /api/trips/{trip_id}/redrive (Trip from the path).
type RedriveFromRequest struct {
	// Trip is the trip's id (T-...).
	Trip string `json:"trip,omitempty"`
	// Step names a step of the trip's version ("payment", "car",
	// "mail", ...): the trip's events are re-delivered from it on.
	Step string `json:"step"`
	// DryRun lists what would be delivered and records nothing.
	DryRun bool `json:"dry_run,omitempty"`
	// Operator (who) and Reason (why) are required unless DryRun.
	Operator string `json:"operator,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// RedriveDelivery is one event of the trip handed to one consumer.
type RedriveDelivery struct {
	// Kind and Type are the event's ("payment.charged" and its type).
	Kind string `json:"kind"`
	Type string `json:"type"`
	// Stream and Seq say where it is stored; At is the event's time (its
	// CloudEvents time, else when it was stored).
	Stream string    `json:"stream"`
	Seq    uint64    `json:"seq"`
	At     time.Time `json:"at"`
	// EventID is the event's id: the consumer's inbox drops the event by
	// it when it has handled the event already.
	EventID string `json:"event_id"`
	// Consumer is the durable consumer (and inbox) it is handed to: the
	// service that carries the re-drive out.
	Consumer string `json:"consumer"`
	// ActionID is the id of the redrive action recorded for it (none in
	// a dry run).
	ActionID string `json:"action_event_id,omitempty"`
}

// RedriveSkip is an event of the trip from the step on that a consumer
// the catalogue names would take, but that is not handed to it, and why.
type RedriveSkip struct {
	Kind     string `json:"kind"`
	Stream   string `json:"stream"`
	Seq      uint64 `json:"seq"`
	EventID  string `json:"event_id,omitempty"`
	Consumer string `json:"consumer,omitempty"`
	Why      string `json:"why"`
}

// RedrivePlan is what a re-drive from a step delivers (or, in a dry run,
// would deliver), in the order the events were stored.
type RedrivePlan struct {
	Trip string `json:"trip"`
	Step string `json:"step"`
	// Version is the trip's version (its saga order, events.VersionOf),
	// whose steps Step is one of.
	Version string `json:"version"`
	DryRun  bool   `json:"dry_run"`
	// Replayed: the Idempotency-Key was used already for this request;
	// the deliveries are those recorded then, and nothing was recorded
	// now.
	Replayed   bool              `json:"replayed,omitempty"`
	Deliveries []RedriveDelivery `json:"deliveries"`
	Skipped    []RedriveSkip     `json:"skipped,omitempty"`
	// Actions are the ids of the redrive actions recorded, one a
	// delivery, in its order.
	Actions []string `json:"actions"`
}

// stepsOfEveryVersion returns the names of the steps of every trip
// version and of c, each once.
func stepsOfEveryVersion(c events.Catalogue) []string {
	var out []string
	for _, v := range append(events.Versions(), c) {
		for _, s := range v.Steps {
			if !slices.Contains(out, s.Name) {
				out = append(out, s.Name)
			}
		}
	}
	return out
}

// redriveTypes returns the event types a re-drive from step name of c
// delivers: what makes the step and every step after it run (their
// triggers and their compensations' triggers), everything they publish
// (their compensations' events too), and, from a compensable step or the
// pivot, the undo events of the steps before it and the events the
// projections publish (trip.canceled), which the step's failure or a
// later step's sets off.
func redriveTypes(c events.Catalogue, name string) []string {
	i := slices.IndexFunc(c.Steps, func(s events.Step) bool { return s.Name == name })
	if i < 0 {
		return nil
	}
	var out []string
	add := func(ts ...string) {
		for _, t := range ts {
			if t != "" && !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	saga := c.Steps[i].Class != events.ForwardOnly
	for j, s := range c.Steps {
		if j < i {
			if saga && s.Class != events.ForwardOnly {
				add(s.UndoEvents()...)
			}
			continue
		}
		add(s.Trigger...)
		if s.Compensation != nil {
			add(s.Compensation.Trigger...)
		}
		add(s.Publishes...)
		add(s.UndoEvents()...)
	}
	if saga {
		for _, p := range c.Projections {
			add(p.Publishes...)
		}
	}
	return slices.DeleteFunc(out, func(t string) bool { return t == c.Operator.Type })
}

// tripMsg is one stored event of the trip.
type tripMsg struct {
	stream string
	m      *jetstream.RawStreamMsg
	e      event.Event
	err    error
}

// tripMsgs reads every stored event about trip on the streams of the
// trips' events (every version's; not OPERATOR, not DEADLETTER) by
// subject, as [Reconciler.streamEntries] does, oldest first.
func (r *Reconciler) tripMsgs(ctx context.Context, trip string) ([]tripMsg, error) {
	var names []string
	for _, t := range events.Full().Types {
		if t.Stream != events.StreamOperator && !slices.Contains(names, t.Stream) {
			names = append(names, t.Stream)
		}
	}
	slices.Sort(names)
	var out []tripMsg
	for _, name := range names {
		s, err := r.cfg.JetStream.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		n := 0
		for _, filter := range []string{"*." + trip, "*.*." + trip, "*.*.*." + trip} {
			for seq := uint64(1); ; {
				m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
				if errors.Is(err, jetstream.ErrMsgNotFound) {
					break
				}
				if err != nil {
					return nil, fmt.Errorf("stream %s: %w", name, err)
				}
				if n++; n > maxRedriveEvents {
					return nil, fmt.Errorf("stream %s holds more than %d events about %s: too many to re-drive at once", name, maxRedriveEvents, trip)
				}
				e, err := events.Decode(m.Header, m.Data)
				out = append(out, tripMsg{stream: name, m: m, e: e, err: err})
				seq = m.Sequence + 1
			}
		}
	}
	slices.SortStableFunc(out, func(a, b tripMsg) int {
		return cmp.Or(a.m.Time.Compare(b.m.Time), cmp.Compare(a.stream, b.stream), cmp.Compare(a.m.Sequence, b.m.Sequence))
	})
	return out, nil
}

// subjectMatches reports whether NATS subject matches filter ("*" one
// token, ">" the rest).
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

// durables tells which durable consumers exist on which streams, and
// what they take, listing each stream's consumers once (CONSUMER.LIST,
// which the reconciler's NATS identity may call on every stream it
// reads; CONSUMER.INFO of another service's consumer it may not).
type durables struct {
	js   jetstream.JetStream
	seen map[string]map[string]*jetstream.ConsumerInfo
}

// takes returns "" when consumer has a durable consumer on stream whose
// filter takes subject, else why not.
func (d *durables) takes(ctx context.Context, stream, consumer, subject string) (string, error) {
	on, ok := d.seen[stream]
	if !ok {
		s, err := d.js.Stream(ctx, stream)
		if err != nil {
			return "", fmt.Errorf("stream %s: %w", stream, err)
		}
		on = map[string]*jetstream.ConsumerInfo{}
		list := s.ListConsumers(ctx)
		for info := range list.Info() {
			on[info.Name] = info
		}
		if err := list.Err(); err != nil {
			return "", fmt.Errorf("consumers of %s: %w", stream, err)
		}
		d.seen[stream] = on
	}
	info := on[consumer]
	if info == nil {
		return fmt.Sprintf("%s has no durable consumer on %s (its service has not consumed the stream yet, or takes these events inside the transaction that publishes them, as the trips service its trip.* events)", consumer, stream), nil
	}
	filters := slices.Clone(info.Config.FilterSubjects)
	if info.Config.FilterSubject != "" {
		filters = append(filters, info.Config.FilterSubject)
	}
	if len(filters) == 0 || slices.ContainsFunc(filters, func(f string) bool { return subjectMatches(f, subject) }) {
		return "", nil
	}
	return fmt.Sprintf("the durable consumer %s on %s does not take %s (its filters: %s)", consumer, stream, subject, strings.Join(filters, ", ")), nil
}

// RedriveFrom re-delivers the trip's events from a step on (see
// [redriveTypes]) to the services that consume them, through their
// inboxes: each event is paired with every service of the trip's version
// that consumes its type and carries out operator actions
// (events.Catalogue.Operator.Consumers, the reconciler's projection
// among them) and has a durable consumer on its stream that takes it; the
// pairs are in the order the events were stored. A dry run returns them
// and changes nothing. Otherwise each is recorded, all in one
// transaction, as a redrive action (events.ActionRedrive, its dead letter
// the stored event with Seq 0, as `tripsaga replay --trip` hands one
// over) under the key "<key>/<consumer>/<event id>"; the consumer's
// operator inbox hands the event to its inbox, which drops it as a
// duplicate when it has handled the event already, so nothing acts twice.
//
// The same key with the same request returns what was recorded then
// (Replayed) and records nothing; with another request it is an
// [ActionError] 409, as [Operator.Act]. A bad trip id, an unknown step
// (of every version, or of the trip's), or a missing operator or reason
// is an ActionError 400 naming the field; a trip with no events 404.
func (o *Operator) RedriveFrom(ctx context.Context, key string, req RedriveFromRequest) (RedrivePlan, error) {
	req.Trip, req.Step = strings.TrimSpace(req.Trip), strings.TrimSpace(req.Step)
	req.Reason, req.Operator = strings.TrimSpace(req.Reason), strings.TrimSpace(req.Operator)
	plan := RedrivePlan{Trip: req.Trip, Step: req.Step, DryRun: req.DryRun, Deliveries: []RedriveDelivery{}, Actions: []string{}}
	if req.Trip == "" {
		return plan, bad("trip", "required: a trip id (T-...)")
	}
	if err := events.ValidateTripID(req.Trip); err != nil {
		return plan, bad("trip", fmt.Sprintf("%q is not a trip id (T-...): no spaces, dots, * or >", req.Trip))
	}
	known := stepsOfEveryVersion(o.r.cfg.Catalogue)
	if !slices.Contains(known, req.Step) {
		return plan, bad("step", "one of "+strings.Join(known, ", ")+": the step to re-drive the trip from")
	}
	if !req.DryRun {
		switch {
		case req.Operator == "":
			return plan, bad("operator", "required: who asks")
		case len(req.Operator) > MaxOperatorChars:
			return plan, bad("operator", fmt.Sprintf("at most %d characters", MaxOperatorChars))
		case req.Reason == "":
			return plan, bad("reason", "required: why")
		case len(req.Reason) > MaxReasonChars:
			return plan, bad("reason", fmt.Sprintf("at most %d characters", MaxReasonChars))
		case key == "":
			return plan, bad("Idempotency-Key", "required: a key of your choosing, sent again with a retried request")
		}
	}
	fp, err := json.Marshal(RedriveFromRequest{Trip: req.Trip, Step: req.Step, Operator: req.Operator, Reason: req.Reason})
	if err != nil {
		return plan, err
	}
	sum := sha256.Sum256(append([]byte("redrive-from\n"), fp...))
	fingerprint := hex.EncodeToString(sum[:])
	if !req.DryRun {
		if done, err := o.redriveRecorded(ctx, key, fingerprint, &plan); done || err != nil {
			return plan, err
		}
	}

	msgs, err := o.r.tripMsgs(ctx, req.Trip)
	if err != nil {
		return plan, fmt.Errorf("events of %s: %w", req.Trip, err)
	}
	if len(msgs) == 0 {
		return plan, &ActionError{Status: http.StatusNotFound, Detail: fmt.Sprintf("no stream holds an event about trip %s", req.Trip)}
	}
	// The trip's version: the first its events carry (every event of a
	// trip carries its trip.requested's; none, the default order).
	for _, m := range msgs {
		if m.err == nil && events.VersionOf(m.e) != "" {
			plan.Version = events.VersionOf(m.e)
			break
		}
	}
	c, err := events.CatalogueOf(plan.Version)
	if err != nil {
		return plan, &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf("trip %s is of version %q, which this reconciler cannot read: %v", req.Trip, plan.Version, err)}
	}
	plan.Version = c.Version()
	if _, ok := c.Step(req.Step); !ok {
		var names []string
		for _, s := range c.Steps {
			names = append(names, s.Name)
		}
		return plan, bad("step", fmt.Sprintf("trip %s (version %s) has no step %q; its steps: %s", req.Trip, plan.Version, req.Step, strings.Join(names, ", ")))
	}
	types := redriveTypes(c, req.Step)
	cons := &durables{js: o.r.cfg.JetStream, seen: map[string]map[string]*jetstream.ConsumerInfo{}}
	var todo []tripMsg
	for _, m := range msgs {
		if m.err != nil {
			plan.Skipped = append(plan.Skipped, RedriveSkip{Kind: m.m.Subject, Stream: m.stream, Seq: m.m.Sequence, Why: "cannot be decoded: " + m.err.Error()})
			continue
		}
		if !slices.Contains(types, m.e.Type()) {
			continue
		}
		kind := events.Kind(m.e.Type())
		if m.e.Subject() != req.Trip {
			plan.Skipped = append(plan.Skipped, RedriveSkip{Kind: kind, Stream: m.stream, Seq: m.m.Sequence, EventID: m.e.ID(),
				Why: fmt.Sprintf("stored under %s but about %q", m.m.Subject, m.e.Subject())})
			continue
		}
		for _, svc := range c.Operator.Consumers {
			if !slices.Contains(c.Consumes(svc), m.e.Type()) {
				continue
			}
			why, err := cons.takes(ctx, m.stream, svc, m.m.Subject)
			if err != nil {
				return plan, err
			}
			if why == "" && slices.ContainsFunc(plan.Deliveries, func(dv RedriveDelivery) bool { return dv.Consumer == svc && dv.EventID == m.e.ID() }) {
				why = "a second copy of an event listed already: its inbox would drop it"
			}
			if why != "" {
				plan.Skipped = append(plan.Skipped, RedriveSkip{Kind: kind, Stream: m.stream, Seq: m.m.Sequence, EventID: m.e.ID(), Consumer: svc, Why: why})
				continue
			}
			plan.Deliveries = append(plan.Deliveries, RedriveDelivery{Kind: kind, Type: m.e.Type(), Stream: m.stream, Seq: m.m.Sequence,
				At: cmp.Or(m.e.Time(), m.m.Time).UTC(), EventID: m.e.ID(), Consumer: svc})
			todo = append(todo, m)
		}
	}
	if req.DryRun || len(plan.Deliveries) == 0 {
		return plan, nil
	}
	for range 3 {
		err = outbox.UnitOfWork{Pool: o.r.cfg.Pool, Relay: o.relay}.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			for i := range plan.Deliveries {
				dv, m := &plan.Deliveries[i], todo[i]
				ev, err := recordIn(ctx, tx, key+"/"+dv.Consumer+"/"+dv.EventID, fingerprint, redriveAction(key, req, dv, m), 0)
				if err != nil {
					return err
				}
				dv.ActionID = ev.ID()
			}
			return nil
		})
		if !errors.Is(err, errRaced) {
			break
		}
		// Another request with the key committed first: answer with it.
		if done, err := o.redriveRecorded(ctx, key, fingerprint, &plan); done || err != nil {
			return plan, err
		}
	}
	if err != nil {
		return plan, fmt.Errorf("record redrive from %s: %w", req.Step, err)
	}
	for _, dv := range plan.Deliveries {
		plan.Actions = append(plan.Actions, dv.ActionID)
	}
	o.log.Info("reconciler: operator re-drive from a step recorded", "trip_id", req.Trip, "step", req.Step,
		"deliveries", len(plan.Deliveries), "operator", req.Operator)
	return plan, nil
}

// redriveAction is the redrive action of delivery dv of the stored event m.
func redriveAction(key string, req RedriveFromRequest, dv *RedriveDelivery, m tripMsg) events.OperatorActionData {
	headers := map[string][]string{}
	for k, v := range m.m.Header {
		if k != jetstream.MsgIDHeader {
			headers[k] = v
		}
	}
	return events.OperatorActionData{
		Action: events.ActionRedrive, TripID: req.Trip, Service: dv.Consumer,
		Reason: "redrive from " + req.Step + ": " + req.Reason, Operator: req.Operator, IdempotencyKey: key,
		DeadLetter: &events.ParkedEvent{
			Stream: dv.Stream, StreamSeq: dv.Seq, Subject: m.m.Subject, Consumer: dv.Consumer,
			Reason:  "re-driven from step " + req.Step + " by " + req.Operator + ": " + req.Reason,
			Headers: headers, Data: m.m.Data,
		},
	}
}

// redriveRecorded fills plan with the actions recorded under key's
// derived keys ("<key>/..."), and reports whether there were any: a
// replay when they were recorded for the same request (fingerprint), an
// ActionError 409 when for another, or when key itself names an action
// of POST /api/actions.
func (o *Operator) redriveRecorded(ctx context.Context, key, fingerprint string, plan *RedrivePlan) (bool, error) {
	if prev, err := queries.OperatorActionGetByKey(ctx, o.r.cfg.Pool, key); err == nil {
		return true, &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf(
			"Idempotency-Key %q was used at %s for another action (%s of %s at %s by %s); use a new key for a new action",
			key, prev.CreatedAt.UTC().Format(time.RFC3339), prev.Action, prev.TripID, prev.Service, prev.Operator)}
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return true, fmt.Errorf("action by key: %w", err)
	}
	rows, err := queries.OperatorActionListByKeyPrefix(ctx, o.r.cfg.Pool, key+"/")
	if err != nil {
		return true, fmt.Errorf("actions by key: %w", err)
	}
	if len(rows) == 0 {
		return false, nil
	}
	if prev := rows[0]; prev.Fingerprint != fingerprint {
		return true, &ActionError{Status: http.StatusConflict, Detail: fmt.Sprintf(
			"Idempotency-Key %q was used at %s for another re-drive (of %s by %s: %s); use a new key for a new action",
			key, prev.CreatedAt.UTC().Format(time.RFC3339), prev.TripID, prev.Operator, prev.Reason)}
	}
	plan.Replayed = true
	plan.Deliveries, plan.Skipped, plan.Actions = []RedriveDelivery{}, nil, []string{}
	for _, row := range rows {
		var ev event.Event
		var d events.OperatorActionData
		if err := json.Unmarshal(row.Event, &ev); err != nil {
			return true, fmt.Errorf("action %s: stored event: %w", row.EventID, err)
		}
		if err := events.DecodeData(ev, &d); err != nil || d.DeadLetter == nil {
			return true, fmt.Errorf("action %s: stored event: not a redrive (%v)", row.EventID, err)
		}
		p := d.DeadLetter
		dv := RedriveDelivery{Stream: p.Stream, Seq: p.StreamSeq, Consumer: p.Consumer, ActionID: ev.ID()}
		if e, err := events.Decode(p.Headers, p.Data); err == nil {
			dv.Kind, dv.Type, dv.EventID, dv.At = events.Kind(e.Type()), e.Type(), e.ID(), e.Time().UTC()
			if plan.Version == "" {
				plan.Version = events.VersionOf(e)
			}
		}
		plan.Deliveries = append(plan.Deliveries, dv)
		plan.Actions = append(plan.Actions, dv.ActionID)
	}
	if c, err := events.CatalogueOf(plan.Version); err == nil {
		plan.Version = c.Version()
	}
	return true, nil
}

// serveRedriveFrom is POST /api/trips/{trip_id}/redrive: a
// RedriveFromRequest as JSON (its trip from the path), answered with the
// RedrivePlan. A dry run is a read (it changes nothing): it needs neither
// the operator token nor an Idempotency-Key, as GET /api/actions; the
// re-drive itself needs both, as POST /api/actions.
func (o *Operator) serveRedriveFrom(w http.ResponseWriter, req *http.Request) {
	var rr RedriveFromRequest
	if !decodeBody(w, req, &rr) {
		return
	}
	trip := req.PathValue("trip_id")
	if rr.Trip != "" && rr.Trip != trip {
		invalid(w, req, "trip", fmt.Sprintf("the body names trip %q, the path %q: leave it out of the body", rr.Trip, trip))
		return
	}
	rr.Trip = trip
	var key string
	if !rr.DryRun {
		var ok bool
		if !o.gate(w, req) {
			return
		}
		if key, ok = idempotencyKey(w, req); !ok {
			return
		}
	}
	plan, err := o.RedriveFrom(req.Context(), key, rr)
	if err != nil {
		o.writeActionError(w, req, "redrive from a step", err)
		return
	}
	code := http.StatusOK
	if len(plan.Actions) > 0 {
		code = http.StatusAccepted
	}
	if plan.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeJSON(w, code, plan)
}
