package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tripsaga/tripsaga/sim/internal/dbsqlc"
)

// DeclinedCardToken is the card token that the card processor always
// declines: 402 {"status":"declined","reason":"card declined"}.
const DeclinedCardToken = "tok_declined"

// Lists: the page size when limit is not given, and the largest allowed.
const (
	ListLimitDefault = 100
	ListLimitMax     = 1000
)

// maxKeyLen bounds an Idempotency-Key, in bytes.
const maxKeyLen = 255

const declineReason = "card declined"

const rejectReason = "risk not insurable"

// spec describes one company: its resource, its operations and its rules.
type spec struct {
	name          string   // path prefix without the slash: hotel
	schema        string   // sim_hotel
	collection    string   // holds
	idField       string   // hold_id
	idPrefix      string   // H-
	createOp      string   // hold
	createdStatus string   // held
	createCode    int      // 201, or 202 for mail
	undoOp        string   // release; empty: no undo (mail)
	undoVerb      string   // path verb: /holds/{key}/release
	undoneStatus  string   // released
	moreStatuses  []string // status words beyond created and undone: declined
	validate      func(v *validator)
	cards         bool // card processor: declines, statements, refund ids
	shortAnswer   bool // mail: POST answers only key, id and status
}

// statuses returns the status words of the company's records: created,
// undone (if it can undo), then moreStatuses.
func (sp *spec) statuses() []string {
	out := []string{sp.createdStatus}
	if sp.undoneStatus != "" {
		out = append(out, sp.undoneStatus)
	}
	return append(out, sp.moreStatuses...)
}

func (sp *spec) ops() []string {
	if sp.undoOp == "" {
		return []string{sp.createOp}
	}
	return []string{sp.createOp, sp.undoOp}
}

func specs() []*spec {
	return []*spec{
		{
			name: "hotel", schema: "sim_hotel", collection: "holds",
			idField: "hold_id", idPrefix: "H-",
			createOp: OpHold, createdStatus: "held", createCode: http.StatusCreated,
			undoOp: OpRelease, undoVerb: "release", undoneStatus: "released",
			validate: func(v *validator) {
				v.str("trip_id")
				v.str("property_id")
				v.date("check_in")
				v.positiveInt("nights")
				v.str("guest.name")
				v.email("guest.email")
			},
		},
		{
			name: "payments", schema: "sim_payments", collection: "charges",
			idField: "charge_id", idPrefix: "C-",
			createOp: OpCharge, createdStatus: "charged", createCode: http.StatusCreated,
			undoOp: OpRefund, undoVerb: "refund", undoneStatus: "refunded",
			moreStatuses: []string{"declined"},
			cards:        true,
			validate: func(v *validator) {
				v.str("trip_id")
				v.positiveInt("amount_cents")
				v.currency("currency")
				v.str("card_token")
			},
		},
		{
			name: "cars", schema: "sim_cars", collection: "bookings",
			idField: "booking_id", idPrefix: "B-",
			createOp: OpBook, createdStatus: "booked", createCode: http.StatusCreated,
			undoOp: OpCancel, undoVerb: "cancel", undoneStatus: "canceled",
			validate: func(v *validator) {
				v.str("trip_id")
				v.str("car_class")
				v.dateRange("pickup", "return")
				v.str("driver.name")
				v.email("driver.email")
			},
		},
		{
			name: "insurer", schema: "sim_insurer", collection: "policies",
			idField: "policy_id", idPrefix: "I-",
			createOp: OpInsure, createdStatus: "active", createCode: http.StatusCreated,
			undoOp: OpVoid, undoVerb: "cancel", undoneStatus: "canceled",
			validate: func(v *validator) {
				v.dateRange("start", "end")
				v.str("trip_id")
				v.str("traveler.name")
				v.email("traveler.email")
				v.positiveInt("trip_cost_cents")
				v.currency("currency")
			},
		},
		{
			name: "mail", schema: "sim_mail", collection: "messages",
			idField: "message_id", idPrefix: "M-",
			createOp: OpMessage, createdStatus: "queued", createCode: http.StatusAccepted,
			shortAnswer: true,
			validate: func(v *validator) {
				v.email("to")
				v.str("subject")
				v.str("text")
				v.str("trip_id")
			},
		},
	}
}

// company is one simulated company: its store (its PostgreSQL schema, or
// memory) and its fault rules.
type company struct {
	s       *Simulators
	sp      *spec
	store   store
	faults  *faultSet
	overlap overlap
	log     *slog.Logger
}

func newCompany(s *Simulators, sp *spec, st store) *company {
	c := &company{
		s:      s,
		sp:     sp,
		store:  st,
		faults: &faultSet{now: time.Now},
		log:    s.log.With("company", sp.name),
	}
	c.overlap.log = c.log
	return c
}

func (c *company) register(mux *http.ServeMux) {
	p := "/" + c.sp.name
	coll := p + "/" + c.sp.collection
	mux.HandleFunc("POST "+coll, c.overlap.track(func(r *http.Request) string { return r.Header.Get("Idempotency-Key") }, c.handleCreate))
	mux.HandleFunc("GET "+coll+"/{key}", c.handleGet)
	mux.HandleFunc("GET "+coll, c.handleList)
	if c.sp.undoOp != "" {
		mux.HandleFunc("POST "+coll+"/{key}/"+c.sp.undoVerb, c.overlap.track(func(r *http.Request) string { return r.PathValue("key") }, c.handleUndo))
	}
	if c.sp.cards {
		mux.HandleFunc("GET "+p+"/statements/{card_token}", c.handleStatement)
	}
	mux.HandleFunc("GET "+p+"/_stats", c.handleStats)
	mux.HandleFunc("POST "+p+"/_faults", c.handleFaultAdd)
	mux.HandleFunc("GET "+p+"/_faults", c.handleFaultList)
	mux.HandleFunc("DELETE "+p+"/_faults", c.handleFaultClear)
	mux.HandleFunc("DELETE "+p+"/_faults/{id}", c.handleFaultRemove)
}

func (c *company) reply(w http.ResponseWriter, r *http.Request, a answer, err error) {
	if err != nil {
		c.log.ErrorContext(r.Context(), "sim request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		writeError(w, http.StatusInternalServerError, "internal")
		return
	}
	writeAnswer(w, a)
}

// handleCreate serves POST /<collection>: validate, apply the transport
// fault, then perform under the Idempotency-Key.
func (c *company) handleCreate(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if strings.TrimSpace(key) == "" {
		writeError(w, http.StatusUnprocessableEntity, "Idempotency-Key: header required")
		return
	}
	if len(key) > maxKeyLen {
		writeError(w, http.StatusUnprocessableEntity, fmt.Sprintf("Idempotency-Key: at most %d bytes", maxKeyLen))
		return
	}
	req, canonical, fingerprint, err := readBody(w, r)
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, err.Error())
		return
	}
	v := &validator{m: req}
	c.sp.validate(v)
	if err := v.err(); err != nil {
		writeError(w, http.StatusUnprocessableEntity, err.Error())
		return
	}
	rule := c.faults.take(c.sp.createOp, req, false)
	c.run(w, r, key, rule, func(ctx context.Context) (answer, error) {
		return c.performCreate(ctx, key, req, canonical, fingerprint)
	})
}

// performCreate claims key and performs the operation in one transaction,
// storing its answer; a key already stored is answered from the store.
func (c *company) performCreate(ctx context.Context, key string, req map[string]any, canonical []byte, fingerprint string) (answer, error) {
	stored, found, a, err := c.store.create(ctx, dbsqlc.IdempotencyClaimParams{
		Key: key, Op: c.sp.createOp, Fingerprint: fingerprint, Request: canonical,
	}, func(w storeTx) (answer, error) {
		return c.execute(ctx, w, key, req, canonical)
	})
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", c.sp.createOp, key, err)
	}
	if found {
		if stored.Fingerprint != fingerprint {
			return errorAnswer(http.StatusUnprocessableEntity, "idempotency_key_reused"), nil
		}
		return answer{status: int(stored.StatusCode), body: stored.Response}, nil
	}
	return a, nil
}

// execute performs a new operation inside tx and returns its answer.
func (c *company) execute(ctx context.Context, tx storeTx, key string, req map[string]any, canonical []byte) (answer, error) {
	var decision *Rule
	if c.sp.cards && str(req, "card_token") == DeclinedCardToken {
		decision = &Rule{Fault: FaultDeclined}
	} else if decision = c.faults.take(c.sp.createOp, req, true); decision != nil {
		c.log.InfoContext(ctx, "sim fault applied", "rule_id", decision.ID, "op", decision.Op,
			"fault", decision.Fault, "idempotency_key", key)
	}
	params := dbsqlc.RecordInsertParams{
		Key:     key,
		ID:      newID(c.sp.idPrefix),
		TripID:  str(req, "trip_id"),
		Status:  c.sp.createdStatus,
		Request: canonical,
	}
	switch {
	case decision != nil && decision.Fault == FaultSoldOut:
		return jsonAnswer(http.StatusConflict, map[string]string{"status": "sold_out"}), nil
	case decision != nil && decision.Fault == FaultRejected:
		return jsonAnswer(http.StatusConflict, map[string]string{"status": "rejected", "reason": rejectReason}), nil
	case decision != nil && decision.Fault == FaultDeclined:
		params.Status = "declined"
		params.Reason = ptr(declineReason)
		if _, err := tx.insertRecord(ctx, params); err != nil {
			return answer{}, fmt.Errorf("insert record: %w", err)
		}
		return jsonAnswer(http.StatusPaymentRequired, map[string]string{"status": "declined", "reason": declineReason}), nil
	}
	rec, err := tx.insertRecord(ctx, params)
	if err != nil {
		return answer{}, fmt.Errorf("insert record: %w", err)
	}
	if c.sp.cards {
		if err := c.statementLine(ctx, tx, rec, req, "charge"); err != nil {
			return answer{}, err
		}
	}
	if c.sp.shortAnswer {
		return jsonAnswer(c.sp.createCode, map[string]string{
			"key": rec.Key, c.sp.idField: rec.ID, "status": rec.Status,
		}), nil
	}
	res, err := c.resource(rec)
	if err != nil {
		return answer{}, err
	}
	return jsonAnswer(c.sp.createCode, res), nil
}

func (c *company) statementLine(ctx context.Context, tx storeTx, rec dbsqlc.Record, req map[string]any, kind string) error {
	err := tx.insertStatementLine(ctx, dbsqlc.StatementLineInsertParams{
		CardToken:   str(req, "card_token"),
		ChargeKey:   rec.Key,
		TripID:      rec.TripID,
		AmountCents: integer(req, "amount_cents"),
		Currency:    str(req, "currency"),
		Kind:        kind,
	})
	if err != nil {
		return fmt.Errorf("insert %s statement line: %w", kind, err)
	}
	return nil
}

// resource renders a record: its request fields plus key, id, trip_id,
// status, reason (declined), refund_id (refunded) and times (RFC 3339, UTC).
func (c *company) resource(rec dbsqlc.Record) (map[string]any, error) {
	m, err := decodeObject(rec.Request)
	if err != nil {
		return nil, fmt.Errorf("record %s: stored request: %w", rec.Key, err)
	}
	m["key"] = rec.Key
	m[c.sp.idField] = rec.ID
	m["trip_id"] = rec.TripID
	m["status"] = rec.Status
	if rec.Reason != nil {
		m["reason"] = *rec.Reason
	}
	if rec.UndoID != nil {
		m["refund_id"] = *rec.UndoID
	}
	if c.sp.cards && rec.Status == c.sp.undoneStatus {
		m["refunded_cents"] = refundedCents(rec, m)
	}
	m["created_at"] = rec.CreatedAt.UTC().Format(time.RFC3339Nano)
	m["updated_at"] = rec.UpdatedAt.UTC().Format(time.RFC3339Nano)
	return m, nil
}

// handleUndo serves POST /<collection>/{key}/<verb> (release, refund,
// cancel). Faults match the original stored request of the key.
func (c *company) handleUndo(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	var orig map[string]any
	stored, err := c.store.idempotency(r.Context(), key)
	switch {
	case err == nil:
		orig, _ = decodeObject(stored.Request)
	case !errors.Is(err, errNotFound):
		c.reply(w, r, answer{}, fmt.Errorf("%s %s: read request: %w", c.sp.undoOp, key, err))
		return
	}
	var amount *int64
	if c.sp.cards {
		var msg string
		if amount, msg = readRefundBody(w, r); msg != "" {
			writeError(w, http.StatusUnprocessableEntity, msg)
			return
		}
	}
	rule := c.faults.take(c.sp.undoOp, orig, false)
	c.run(w, r, key, rule, func(ctx context.Context) (answer, error) {
		return c.performUndo(ctx, key, amount)
	})
}

// readRefundBody reads the optional body of a refund (providers.md,
// "Partial refunds"): none, or {"amount_cents": N} with N an integer of
// at least 1. It returns nil for a full refund, or a message naming the
// field for a body that breaks the rule.
func readRefundBody(w http.ResponseWriter, r *http.Request) (*int64, string) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		return nil, "body: " + err.Error()
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, ""
	}
	m, err := decodeObject(raw)
	if err != nil {
		return nil, "body: " + err.Error()
	}
	for k := range m {
		if k != "amount_cents" {
			return nil, fmt.Sprintf("%s: unknown field (a refund's body has only amount_cents)", k)
		}
	}
	v := &validator{m: m}
	v.positiveInt("amount_cents")
	if err := v.err(); err != nil {
		return nil, err.Error()
	}
	n := integer(m, "amount_cents")
	return &n, ""
}

// int8Of is n as a nullable bigint (NULL for nil).
func int8Of(n *int64) pgtype.Int8 {
	if n == nil {
		return pgtype.Int8{}
	}
	return pgtype.Int8{Int64: *n, Valid: true}
}

// refundedCents is what a refunded charge's record says was refunded: its
// refunded_cents, or (refunded whole, before partial refunds) the charge.
func refundedCents(rec dbsqlc.Record, req map[string]any) int64 {
	if rec.RefundedCents.Valid {
		return rec.RefundedCents.Int64
	}
	return integer(req, "amount_cents")
}

// performUndo undoes the CURRENT record of key, if it is in force. A key
// never seen, or a declined charge, answers {"status":"none"}; an undone
// record answers as its undo did. amount (the card processor only) refunds
// that much of the charge instead of all of it; more than was charged is
// refused (422) and nothing happens. A charge is refunded once: a refund
// of a refunded charge answers the first refund again, whatever amount it
// asks.
func (c *company) performUndo(ctx context.Context, key string, amount *int64) (answer, error) {
	a, err := c.store.undo(ctx, key, func(recp *dbsqlc.Record, tx storeTx) (answer, error) {
		if recp == nil {
			return noneAnswer, nil
		}
		rec := *recp
		switch rec.Status {
		case c.sp.createdStatus:
			var undoID *string
			var refunded *int64
			var req map[string]any
			if c.sp.cards {
				var err error
				if req, err = decodeObject(rec.Request); err != nil {
					return answer{}, fmt.Errorf("stored request: %w", err)
				}
				charged := integer(req, "amount_cents")
				refunded = &charged
				if amount != nil {
					if *amount > charged {
						return errorAnswer(http.StatusUnprocessableEntity, fmt.Sprintf("amount_cents: at most the %d charged, got %d", charged, *amount)), nil
					}
					refunded = amount
				}
				undoID = ptr(newID("R-"))
			}
			var err error
			rec, err = tx.setStatus(ctx, dbsqlc.RecordSetStatusParams{
				Key: key, Status: c.sp.undoneStatus, UndoID: undoID, RefundedCents: int8Of(refunded),
			})
			if err != nil {
				return answer{}, fmt.Errorf("set status: %w", err)
			}
			if c.sp.cards {
				line := maps.Clone(req)
				line["amount_cents"] = json.Number(strconv.FormatInt(*refunded, 10))
				if err := c.statementLine(ctx, tx, rec, line, "refund"); err != nil {
					return answer{}, err
				}
			}
		case c.sp.undoneStatus:
		default: // declined
			return noneAnswer, nil
		}
		out := map[string]any{"key": rec.Key, c.sp.idField: rec.ID, "status": rec.Status}
		if rec.UndoID != nil {
			out["refund_id"] = *rec.UndoID
		}
		if c.sp.cards {
			req, err := decodeObject(rec.Request)
			if err != nil {
				return answer{}, fmt.Errorf("stored request: %w", err)
			}
			out["refunded_cents"] = refundedCents(rec, req)
		}
		return jsonAnswer(http.StatusOK, out), nil
	})
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", c.sp.undoOp, key, err)
	}
	return a, nil
}

// handleGet serves GET /<collection>/{key}. An answer fault rule of the
// company (bad_body, wrong_key, ...) applies here too.
func (c *company) handleGet(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	rec, err := c.store.record(r.Context(), key)
	var a answer
	var req map[string]any
	switch {
	case errors.Is(err, errNotFound):
		a = jsonAnswer(http.StatusNotFound, map[string]string{"status": "none"})
	case err != nil:
		c.reply(w, r, answer{}, fmt.Errorf("get %s: %w", key, err))
		return
	default:
		res, err := c.resource(rec)
		if err != nil {
			c.reply(w, r, answer{}, err)
			return
		}
		a = jsonAnswer(http.StatusOK, res)
		req, _ = decodeObject(rec.Request)
	}
	if rule := c.faults.takeForStatus(req); rule != nil {
		c.log.InfoContext(r.Context(), "sim fault applied", "rule_id", rule.ID,
			"op", "status", "fault", rule.Fault, "idempotency_key", key)
		if rule.Fault == FaultUnauthorized {
			a = unauthorizedAnswer(rule)
		} else {
			a = misanswer(rule, a)
		}
	}
	writeAnswer(w, a)
}

// handleList serves GET /<collection>?status=&trip_id=&after=&limit=:
// records oldest first; next is set only when another page exists.
func (c *company) handleList(w http.ResponseWriter, r *http.Request) {
	qv := r.URL.Query()
	params := dbsqlc.RecordListParams{MaxRows: ListLimitDefault + 1}
	limit := ListLimitDefault
	if s := qv.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > ListLimitMax {
			writeError(w, http.StatusUnprocessableEntity, fmt.Sprintf("limit: want an integer from 1 to %d, got %q", ListLimitMax, s))
			return
		}
		limit = n
	}
	params.MaxRows = int32(limit + 1)
	if s := qv.Get("after"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusUnprocessableEntity, fmt.Sprintf("after: not a cursor from this list: %q", s))
			return
		}
		params.AfterSeq = n
	}
	if s := qv.Get("status"); s != "" {
		if !slices.Contains(c.sp.statuses(), s) {
			writeError(w, http.StatusUnprocessableEntity, fmt.Sprintf("status: want one of %v, got %q", c.sp.statuses(), s))
			return
		}
		params.Status = ptr(s)
	}
	if s := qv.Get("trip_id"); s != "" {
		params.TripID = ptr(s)
	}
	recs, err := c.store.list(r.Context(), params)
	if err != nil {
		c.reply(w, r, answer{}, fmt.Errorf("list: %w", err))
		return
	}
	out := map[string]any{}
	if len(recs) > limit {
		recs = recs[:limit]
		out["next"] = strconv.FormatInt(recs[len(recs)-1].Seq, 10)
	}
	items := make([]map[string]any, 0, len(recs))
	for _, rec := range recs {
		res, err := c.resource(rec)
		if err != nil {
			c.reply(w, r, answer{}, err)
			return
		}
		items = append(items, res)
	}
	out["items"] = items
	writeJSON(w, http.StatusOK, out)
}

// handleStatement serves GET /statements/{card_token}: the card's lines,
// oldest first. amount_cents is positive; kind says charge or refund.
func (c *company) handleStatement(w http.ResponseWriter, r *http.Request) {
	lines, err := c.store.statement(r.Context(), r.PathValue("card_token"))
	if err != nil {
		c.reply(w, r, answer{}, fmt.Errorf("statement: %w", err))
		return
	}
	out := make([]map[string]any, 0, len(lines))
	for _, l := range lines {
		out = append(out, map[string]any{
			"key":          l.ChargeKey,
			"trip_id":      l.TripID,
			"amount_cents": l.AmountCents,
			"currency":     l.Currency,
			"kind":         l.Kind,
			"at":           l.At.UTC().Format(time.RFC3339Nano),
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"lines": out})
}

func ptr[T any](v T) *T { return &v }
