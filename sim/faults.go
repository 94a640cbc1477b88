package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Operations a fault rule applies to.
const (
	OpHold    = "hold"    // hotel POST /holds
	OpRelease = "release" // hotel POST /holds/{key}/release
	OpCharge  = "charge"  // payments POST /charges
	OpRefund  = "refund"  // payments POST /charges/{key}/refund
	OpBook    = "book"    // cars POST /bookings
	OpCancel  = "cancel"  // cars POST /bookings/{key}/cancel
	OpMessage = "message" // mail POST /messages
	OpInsure  = "insure"  // insurer POST /policies
	OpVoid    = "void"    // insurer POST /policies/{key}/cancel
)

// Faults a rule injects.
const (
	// FaultSoldOut answers 409 {"status":"sold_out"} (ops hold, book). The
	// answer is stored as the key's first answer; no record is made.
	FaultSoldOut = "sold_out"
	// FaultDeclined answers 402 {"status":"declined","reason":"card declined"}
	// (op charge). The charge is stored as a record with status declined.
	FaultDeclined = "declined"
	// FaultRejected answers 409 {"status":"rejected","reason":"risk not
	// insurable"} (op insure). The answer is stored as the key's first
	// answer; no record is made.
	FaultRejected = "rejected"
	// FaultFail answers 503 {"error":"unavailable"}; nothing is stored and
	// nothing happens. With Rule.ForMS it fails for that long, counted from
	// the first matching request, and then stops applying.
	FaultFail = "fail"
	// FaultLoseAnswer commits the operation, then closes the connection
	// without answering. A retry with the same key replays the answer.
	FaultLoseAnswer = "lose_answer"
	// FaultHang does nothing and never answers until the caller gives up or
	// Rule.DelayMS passes (then 504 {"error":"timeout"}); nothing happens.
	FaultHang = "hang"
	// FaultCommitLate does not answer. It commits the operation Rule.DelayMS
	// after the request arrived, even though the caller has gone; the
	// connection is closed without an answer once the caller gives up or the
	// late commit is done. If the key was committed meanwhile (a retry), the
	// late commit is a no-op replay.
	FaultCommitLate = "commit_late"
	// FaultSlowAnswer commits at once, then answers Rule.DelayMS later (or
	// not at all if the caller gives up first).
	FaultSlowAnswer = "slow_answer"
	// FaultRefuse answers 422 {"error": Rule.Reason} (default "refused")
	// and nothing happens: a company refusing for good, e.g. a refund to a
	// closed card. Applies to every op, replays included.
	FaultRefuse = "refuse"

	// The misbehaving companies of issue 6 (item 4): answers that break
	// providers.md. They are our own test extension, never the simulators'
	// normal behaviour. Each also applies to GET /<collection>/{key} of the
	// keys the rule selects (matched against the key's stored request; a
	// key with no record only by rules without Match), so asking by key
	// gets the same wrong answer while the rule applies; Times counts those
	// answers too. Lists are never affected.

	// FaultBadBody performs the operation, then answers its status code
	// with the first half of its body: JSON that does not parse.
	FaultBadBody = "bad_body"
	// FaultWrongKey performs the operation, then answers with "key" naming
	// another key (the key sent followed by ":other"). Answers without a
	// "key" ({"status":"none"}) are left alone.
	FaultWrongKey = "wrong_key"
	// FaultWrongAmount (op charge) performs the charge, then answers with
	// amount_cents 100 times the amount charged (units taken for cents).
	FaultWrongAmount = "wrong_amount"
	// FaultUnknownStatus performs the operation, then answers a 2xx with
	// the status word "pending_review", which the contract does not know.
	FaultUnknownStatus = "unknown_status"
	// FaultUnauthorized answers 401 {"error": Rule.Reason} (default
	// "credentials expired") and nothing happens: expired credentials.
	// Applies to every op, replays included.
	FaultUnauthorized = "unauthorized"
)

// UnknownStatusWord is the status word [FaultUnknownStatus] answers.
const UnknownStatusWord = "pending_review"

// isAnswerFault reports whether f is one of the misbehaving-answer faults,
// which also apply to GET /<collection>/{key}.
func isAnswerFault(f string) bool {
	switch f {
	case FaultBadBody, FaultWrongKey, FaultWrongAmount, FaultUnknownStatus, FaultUnauthorized:
		return true
	}
	return false
}

// Default delays of the faults that wait, used when Rule.DelayMS is 0.
const (
	HangDefault       = 60 * time.Second
	CommitLateDefault = 2 * time.Second
	SlowAnswerDefault = 2 * time.Second
)

// Rule is one fault rule of one company, added with POST <company>/_faults
// (or [AddFault]). A request that matches several rules gets the first one
// in the order they were added: the first transport fault (fail,
// lose_answer, hang, commit_late, slow_answer, refuse, and the misbehaving
// answers bad_body, wrong_key, wrong_amount, unknown_status, unauthorized)
// when it arrives, and the first business fault (sold_out, declined) when
// it is performed for a new key. Transport faults also apply to replays of
// a stored key; business faults only to new keys. The misbehaving answers
// also apply to GET /<collection>/{key}.
type Rule struct {
	// ID is set by the company when the rule is added, e.g. "F-1".
	ID string `json:"id,omitempty"`
	// Op is the operation: one of the Op constants of this company.
	Op string `json:"op"`
	// Match selects requests by dotted paths into the request body
	// ("card_token", "driver.email", "trip_id"). For undo ops it is matched
	// against the original stored request of that key. All entries must
	// equal the value (a JSON string as itself, other values as their JSON
	// text). Empty matches every request.
	Match map[string]string `json:"match,omitempty"`
	// Fault is one of the Fault constants.
	Fault string `json:"fault"`
	// Times is how many matching requests the rule applies to; 0 = no limit.
	Times int `json:"times,omitempty"`
	// ForMS (fault fail only), in milliseconds: fail for this long from the
	// first matching request, then stop. 0 = no time limit.
	ForMS int `json:"for_ms,omitempty"`
	// DelayMS (hang, commit_late, slow_answer), in milliseconds. Defaults to
	// [HangDefault], [CommitLateDefault], [SlowAnswerDefault].
	DelayMS int `json:"delay_ms,omitempty"`
	// Reason (faults refuse and unauthorized) is the refusal's "error" text.
	Reason string `json:"reason,omitempty"`
	// Chance, from 0 to 1, makes the rule probabilistic: each matching
	// request draws a random number and the rule applies only with this
	// probability; a request it does not apply to goes on to the next
	// rule and is not counted in Times or Applied. 0 (unset) and 1 apply
	// to every matching request. This is our own test extension for
	// `tripsaga chaos`, which arms a set of such rules on every company;
	// without a rule the simulators follow providers.md exactly.
	Chance float64 `json:"chance,omitempty"`
	// Applied counts the requests the rule was applied to (read only).
	Applied int `json:"applied,omitempty"`
}

// ruleWire decodes a rule whose match values may be any JSON scalar.
type ruleWire struct {
	Op      string                     `json:"op"`
	Match   map[string]json.RawMessage `json:"match"`
	Fault   string                     `json:"fault"`
	Times   int                        `json:"times"`
	ForMS   int                        `json:"for_ms"`
	DelayMS int                        `json:"delay_ms"`
	Reason  string                     `json:"reason"`
	Chance  float64                    `json:"chance"`
}

func isBusinessFault(f string) bool {
	return f == FaultSoldOut || f == FaultDeclined || f == FaultRejected
}

func (r Rule) delay() time.Duration {
	if r.DelayMS > 0 {
		return time.Duration(r.DelayMS) * time.Millisecond
	}
	switch r.Fault {
	case FaultHang:
		return HangDefault
	case FaultCommitLate:
		return CommitLateDefault
	case FaultSlowAnswer:
		return SlowAnswerDefault
	}
	return 0
}

// validate checks the rule for a company whose ops are ops.
func (r Rule) validate(ops []string) error {
	if !slices.Contains(ops, r.Op) {
		return fmt.Errorf("op: want one of %v, got %q", ops, r.Op)
	}
	switch r.Fault {
	case FaultSoldOut:
		if r.Op != OpHold && r.Op != OpBook {
			return fmt.Errorf("fault: sold_out applies to ops hold and book, not %q", r.Op)
		}
	case FaultRejected:
		if r.Op != OpInsure {
			return fmt.Errorf("fault: rejected applies to op insure, not %q", r.Op)
		}
	case FaultDeclined:
		if r.Op != OpCharge {
			return fmt.Errorf("fault: declined applies to op charge, not %q", r.Op)
		}
	case FaultWrongAmount:
		if r.Op != OpCharge {
			return fmt.Errorf("fault: wrong_amount applies to op charge, not %q", r.Op)
		}
	case FaultFail, FaultLoseAnswer, FaultHang, FaultCommitLate, FaultSlowAnswer, FaultRefuse,
		FaultBadBody, FaultWrongKey, FaultUnknownStatus, FaultUnauthorized:
	default:
		return fmt.Errorf("fault: want one of sold_out, declined, rejected, fail, lose_answer, hang, commit_late, slow_answer, refuse, "+
			"bad_body, wrong_key, wrong_amount, unknown_status, unauthorized, got %q", r.Fault)
	}
	if r.Reason != "" && r.Fault != FaultRefuse && r.Fault != FaultUnauthorized {
		return fmt.Errorf("reason: applies to faults refuse and unauthorized only")
	}
	if r.Times < 0 {
		return fmt.Errorf("times: must not be negative, got %d", r.Times)
	}
	if r.ForMS < 0 {
		return fmt.Errorf("for_ms: must not be negative, got %d", r.ForMS)
	}
	if r.ForMS > 0 && r.Fault != FaultFail {
		return fmt.Errorf("for_ms: applies to fault fail only")
	}
	if math.IsNaN(r.Chance) || r.Chance < 0 || r.Chance > 1 {
		return fmt.Errorf("chance: want a probability from 0 to 1, got %v", r.Chance)
	}
	if r.DelayMS < 0 {
		return fmt.Errorf("delay_ms: must not be negative, got %d", r.DelayMS)
	}
	if r.DelayMS > 0 && r.Fault != FaultHang && r.Fault != FaultCommitLate && r.Fault != FaultSlowAnswer {
		return fmt.Errorf("delay_ms: applies to faults hang, commit_late and slow_answer only")
	}
	return nil
}

// faultSet holds one company's rules, in memory.
type faultSet struct {
	mu     sync.Mutex
	nextID int
	rules  []*ruleState
	now    func() time.Time
	// draw returns a random number in [0, 1) for rules with a Chance;
	// nil: math/rand/v2's.
	draw func() float64
}

// drawn reports whether a rule with a Chance applies to this request:
// always without one (0 or 1), otherwise with that probability. Called
// with f.mu held.
func (f *faultSet) drawn(r *ruleState) bool {
	if r.Chance <= 0 || r.Chance >= 1 {
		return true
	}
	draw := f.draw
	if draw == nil {
		draw = rand.Float64
	}
	return draw() < r.Chance
}

type ruleState struct {
	Rule
	firstMatch time.Time // of a fail rule with ForMS
}

func (f *faultSet) add(r Rule) Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	r.ID = "F-" + strconv.Itoa(f.nextID)
	r.Applied = 0
	f.rules = append(f.rules, &ruleState{Rule: r})
	return r
}

func (f *faultSet) list() []Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Rule, 0, len(f.rules))
	for _, r := range f.rules {
		out = append(out, r.Rule)
	}
	return out
}

func (f *faultSet) clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
}

// remove deletes the rule with id and reports whether there was one.
func (f *faultSet) remove(id string) (Rule, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range f.rules {
		if r.ID == id {
			f.rules = slices.Delete(f.rules, i, i+1)
			return r.Rule, true
		}
	}
	return Rule{}, false
}

// take returns a copy of the first applicable rule for op and the request
// body req (nil: unknown key, matched only by rules without Match), and
// counts it as applied. business selects sold_out/declined rules, otherwise
// the transport faults.
func (f *faultSet) take(op string, req map[string]any, business bool) *Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	for _, r := range f.rules {
		if r.Op != op || isBusinessFault(r.Fault) != business {
			continue
		}
		if r.Times > 0 && r.Applied >= r.Times {
			continue
		}
		if !matches(r.Match, req) {
			continue
		}
		if r.Fault == FaultFail && r.ForMS > 0 {
			if r.firstMatch.IsZero() {
				r.firstMatch = now
			}
			if now.Sub(r.firstMatch) >= time.Duration(r.ForMS)*time.Millisecond {
				continue
			}
		}
		if !f.drawn(r) {
			continue
		}
		r.Applied++
		cp := r.Rule
		return &cp
	}
	return nil
}

// takeForStatus returns a copy of the first applicable answer fault rule
// (any op of the company) for GET /<collection>/{key} of a key whose
// stored request is req (nil: no record), and counts it as applied.
func (f *faultSet) takeForStatus(req map[string]any) *Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules {
		if !isAnswerFault(r.Fault) || (r.Times > 0 && r.Applied >= r.Times) || !matches(r.Match, req) || !f.drawn(r) {
			continue
		}
		r.Applied++
		cp := r.Rule
		return &cp
	}
	return nil
}

// misanswer returns a as a company applying the answer fault rule to it
// (bad_body, wrong_key, wrong_amount, unknown_status) would answer it.
func misanswer(rule *Rule, a answer) answer {
	if rule.Fault == FaultBadBody {
		return answer{status: a.status, body: a.body[:len(a.body)/2]}
	}
	m, err := decodeObject(a.body)
	if err != nil {
		return a
	}
	switch rule.Fault {
	case FaultWrongKey:
		k, ok := m["key"].(string)
		if !ok {
			return a
		}
		m["key"] = k + ":other"
	case FaultWrongAmount:
		n, ok := m["amount_cents"].(json.Number)
		if !ok {
			return a
		}
		v, err := n.Int64()
		if err != nil {
			return a
		}
		m["amount_cents"] = v * 100
	case FaultUnknownStatus:
		if _, ok := m["status"]; !ok || a.status >= 300 {
			return a
		}
		m["status"] = UnknownStatusWord
	default:
		return a
	}
	return jsonAnswer(a.status, m)
}

func matches(match map[string]string, req map[string]any) bool {
	for path, want := range match {
		v, ok := lookup(req, path)
		if !ok || matchString(v) != want {
			return false
		}
	}
	return true
}

func (c *company) handleFaultAdd(w http.ResponseWriter, r *http.Request) {
	var wire ruleWire
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&wire); err != nil {
		writeError(w, http.StatusUnprocessableEntity, "body: "+err.Error())
		return
	}
	rule := Rule{Op: wire.Op, Fault: wire.Fault, Times: wire.Times, ForMS: wire.ForMS, DelayMS: wire.DelayMS, Reason: wire.Reason, Chance: wire.Chance}
	if len(wire.Match) > 0 {
		rule.Match = make(map[string]string, len(wire.Match))
		for k, raw := range wire.Match {
			var v any
			if err := json.Unmarshal(raw, &v); err != nil {
				writeError(w, http.StatusUnprocessableEntity, "match."+k+": "+err.Error())
				return
			}
			if s, ok := v.(string); ok {
				rule.Match[k] = s
			} else {
				rule.Match[k] = string(compactJSON(raw))
			}
		}
	}
	if err := rule.validate(c.sp.ops()); err != nil {
		writeError(w, http.StatusUnprocessableEntity, err.Error())
		return
	}
	rule = c.faults.add(rule)
	c.log.InfoContext(r.Context(), "sim fault added", "rule_id", rule.ID,
		"op", rule.Op, "fault", rule.Fault, "match", rule.Match, "times", rule.Times,
		"for_ms", rule.ForMS, "delay_ms", rule.DelayMS, "chance", rule.Chance)
	writeJSON(w, http.StatusCreated, rule)
}

func compactJSON(raw []byte) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return raw
	}
	return buf.Bytes()
}

func (c *company) handleFaultList(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"items": c.faults.list()})
}

// handleFaultRemove serves DELETE <company>/_faults/{id}: removes one rule
// (404 if there is none with that id) and answers it, with its Applied.
func (c *company) handleFaultRemove(w http.ResponseWriter, r *http.Request) {
	rule, ok := c.faults.remove(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusNotFound, "no fault rule "+r.PathValue("id"))
		return
	}
	c.log.InfoContext(r.Context(), "sim fault removed", "rule_id", rule.ID, "applied", rule.Applied)
	writeJSON(w, http.StatusOK, rule)
}

func (c *company) handleFaultClear(w http.ResponseWriter, r *http.Request) {
	c.faults.clear()
	c.log.InfoContext(r.Context(), "sim faults cleared")
	writeJSON(w, http.StatusOK, map[string]any{"items": []Rule{}})
}

// run performs an operation under the transport fault of its request
// (nil: none) and answers. perform must be safe to run after the caller has
// gone; it gets a context that the caller's disconnect does not cancel.
func (c *company) run(w http.ResponseWriter, r *http.Request, key string, rule *Rule, perform func(ctx context.Context) (answer, error)) {
	ctx := context.WithoutCancel(r.Context())
	if rule == nil {
		a, err := perform(ctx)
		c.reply(w, r, a, err)
		return
	}
	arrived := time.Now()
	c.log.InfoContext(r.Context(), "sim fault applied", "rule_id", rule.ID,
		"op", rule.Op, "fault", rule.Fault, "idempotency_key", key)
	switch rule.Fault {
	case FaultFail:
		writeError(w, http.StatusServiceUnavailable, "unavailable")
	case FaultRefuse:
		why := rule.Reason
		if why == "" {
			why = "refused"
		}
		writeError(w, http.StatusUnprocessableEntity, why)
	case FaultUnauthorized:
		writeAnswer(w, unauthorizedAnswer(rule))
	case FaultBadBody, FaultWrongKey, FaultWrongAmount, FaultUnknownStatus:
		a, err := perform(ctx)
		if err == nil {
			a = misanswer(rule, a)
		}
		c.reply(w, r, a, err)
	case FaultHang:
		t := time.NewTimer(rule.delay())
		defer t.Stop()
		select {
		case <-r.Context().Done():
		case <-c.s.closing:
			writeError(w, http.StatusServiceUnavailable, "unavailable")
		case <-t.C:
			writeError(w, http.StatusGatewayTimeout, "timeout")
		}
	case FaultCommitLate:
		done := make(chan struct{})
		started := c.s.goLate(func() {
			defer close(done)
			t := time.NewTimer(time.Until(arrived.Add(rule.delay())))
			defer t.Stop()
			select {
			case <-c.s.closing:
				c.log.Warn("sim late commit dropped: closing", "idempotency_key", key)
				return
			case <-t.C:
			}
			a, err := perform(c.s.baseCtx)
			if err != nil {
				c.log.Error("sim late commit", "idempotency_key", key, "error", err)
				return
			}
			c.log.Info("sim late commit done", "idempotency_key", key, "status", a.status)
			c.s.lateCommits.Add(1)
		})
		if !started {
			close(done)
		}
		select {
		case <-r.Context().Done():
		case <-done:
		case <-c.s.closing:
		}
		abortConnection(w)
	case FaultLoseAnswer:
		if _, err := perform(ctx); err != nil {
			c.log.ErrorContext(ctx, "sim perform", "idempotency_key", key, "error", err)
		}
		abortConnection(w)
	case FaultSlowAnswer:
		a, err := perform(ctx)
		t := time.NewTimer(time.Until(arrived.Add(rule.delay())))
		defer t.Stop()
		select {
		case <-r.Context().Done():
			return
		case <-c.s.closing:
		case <-t.C:
		}
		c.reply(w, r, a, err)
	default:
		a, err := perform(ctx)
		c.reply(w, r, a, err)
	}
}

func unauthorizedAnswer(rule *Rule) answer {
	why := rule.Reason
	if why == "" {
		why = "credentials expired"
	}
	return errorAnswer(http.StatusUnauthorized, why)
}

// abortConnection closes the connection without writing an answer: the
// caller sees a connection error.
func abortConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// HTTP/2 or already hijacked: abort the handler, which resets the
		// stream or closes the connection without an answer.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}
