// Package provider is the HTTP/JSON client of the outside companies
// (shared/contracts/providers.md): the hotel, the card processor, the car
// firm and the mail relay. All four share one shape: create by POST with an
// Idempotency-Key, undo by the same key, status by key, lists for
// reconciliation; so one [Client] serves all four, told its resource names.
package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tripsaga/tripsaga/internal/fault"
	"github.com/tripsaga/tripsaga/internal/tracing"
)

// Outcome is what a company's answer decides.
type Outcome string

const (
	// Done: the company did it (201/200/202).
	Done Outcome = "done"
	// Rejected: a business answer that decides (409 sold out, 402
	// declined, 422 refused). Never retried.
	Rejected Outcome = "rejected"
	// Undone: an undo took effect, or had already.
	Undone Outcome = "undone"
	// None: the company knows nothing under that key (an undo of a step
	// that never happened, or a 404 status).
	None Outcome = "none"
)

// ErrUnknownOutcome is wrapped by every error that leaves the outcome
// unknown: a timeout, a 5xx, a lost connection, an answer we cannot read.
// The operation may or may not have happened; ask again by the same key.
//
// A company that misbehaves is unknown too, never success (issue 6, item
// 4), whatever its status code says:
//
//   - a body that does not parse as one JSON object, or a 2xx (404 for a
//     status) that lacks a field providers.md gives it ("key", the id
//     field, "status", and for the card processor "amount_cents" and
//     "currency");
//   - a 2xx whose status word the contract does not know for that call
//     (a create must say [Client.ActiveStatus], an undo
//     [Client.UndoneStatus] or "none", a status one of [Client.Statuses]);
//   - a 2xx naming another Idempotency-Key than the one sent, or another
//     amount or currency than requested: a [*MismatchError];
//   - 401 or 403 to a create or a status: a [*CredentialsError].
//
// The last two also wrap ErrUnknownOutcome but carry a type of their own,
// because asking again by key will not fix them: the saga raises an
// incident for a person while it goes on asking.
var ErrUnknownOutcome = errors.New("provider: outcome unknown")

// MismatchError is returned for a 2xx answer that names another
// Idempotency-Key than the one sent, or (with the request known: [Client.Create],
// [Client.StatusFor]) another value of a field the answer must echo
// ([Client.Echo]: amount_cents and currency for the card processor). The
// answer is about something else than what we asked, so it is never taken
// as success: it wraps [ErrUnknownOutcome], and the same request is sent
// again by the same key. The saga raises an incident at the first one
// (forward_answer_mismatch, compensation_answer_mismatch).
type MismatchError struct {
	// Op is the call: "create", "status" or the undo verb.
	Op string
	// Field is the answer's field that disagrees: "key", "amount_cents", ...
	Field string
	// Want is what we sent (as JSON text for numbers), Got what came back.
	Want, Got string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s: %s answer names %s %s, not the %s sent", ErrUnknownOutcome, e.Op, e.Field, e.Got, e.Want)
}

// Unwrap returns [ErrUnknownOutcome].
func (e *MismatchError) Unwrap() error { return ErrUnknownOutcome }

// CredentialsError is returned when the company answers a create or a
// status with 401 or 403 (expired or revoked credentials). It is not a
// business rejection (providers.md's deciding answers are 409, 402 and
// 422) and nothing happened at the company, but nothing will until a
// person renews the credentials: it wraps [ErrUnknownOutcome], the step is
// asked again by the same key, and the saga raises an incident
// (company_credentials) at the first one. An undo answered 401/403 is a
// [*RefusedError] instead.
type CredentialsError struct {
	// Op is the call: "create" or "status".
	Op string
	// Code is 401 or 403.
	Code int
	// Reason is the company's own words, or the status text.
	Reason string
}

func (e *CredentialsError) Error() string {
	return fmt.Sprintf("%s: %s refused for our credentials: %d %s", ErrUnknownOutcome, e.Op, e.Code, e.Reason)
}

// Unwrap returns [ErrUnknownOutcome].
func (e *CredentialsError) Unwrap() error { return ErrUnknownOutcome }

// RefusedError is returned by [Client.Undo] when the company refuses the
// undo for good with a 4xx answer (e.g. 422 {"error":"card closed"}, 401
// expired credentials): asking again by the same key will not change the
// answer until a person acts. It does not wrap [ErrUnknownOutcome]; 408,
// 425 and 429 are not refusals (the company asks to be asked again) and
// do wrap it.
type RefusedError struct {
	// Op is the undo verb ("refund", "release", "cancel").
	Op string
	// Code is the HTTP status code.
	Code int
	// Reason is the company's own words (the body's "error", "reason" or
	// "status"), or the status text.
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("provider: %s refused by the company: %d %s", e.Op, e.Code, e.Reason)
}

// Result is a deciding answer.
type Result struct {
	Outcome Outcome
	// Ref is the company's id of the resource (hold_id, charge_id, ...).
	Ref string
	// Status is the company's status word ("held", "sold_out", "none").
	Status string
	// Reason explains a rejection ("sold out", "declined: insufficient funds").
	Reason string
	// Code is the HTTP status code.
	Code int
	// RefundedCents is what a refunded charge's answer says was refunded
	// ("refunded_cents", providers.md: partial refunds), 0 when it says
	// nothing.
	RefundedCents int64
}

// Client calls one company.
//
// With tracing on (internal/tracing), each create, undo and status is a
// client span ("<company> <operation>", a child of ctx's span) carrying the
// Idempotency-Key, the company, the operation and the outcome as
// attributes (tripsaga.idempotency_key, tripsaga.company,
// tripsaga.operation, tripsaga.outcome), and the request carries the W3C
// traceparent header.
type Client struct {
	// Company names the company in spans: "hotel", "payments", "cars",
	// "mail". Defaults to Resource.
	Company string
	// BaseURL of the company, e.g. $HOTEL_URL.
	BaseURL string
	// Resource is the collection name: "holds", "charges", "bookings",
	// "messages".
	Resource string
	// IDField names the company's id in answers: "hold_id", ...
	IDField string
	// UndoVerb is the undo path element: "release", "refund", "cancel";
	// empty for the mail relay (an email cannot be unsent).
	UndoVerb string
	// ActiveStatus is the status of a resource that is in force and would
	// need undoing: "held", "charged", "booked", "queued". A create's 2xx
	// must say it.
	ActiveStatus string
	// UndoneStatus is the status word of an undo that took effect:
	// "released", "refunded", "canceled"; empty for the mail relay.
	UndoneStatus string
	// RejectedStatus is the status word of a record the company keeps of
	// a business rejection, "declined" for the card processor
	// (providers.md: a declined charge stays readable by key); empty when
	// it keeps none. RejectedReason is the reason to give for it, the
	// one its direct answer gives ("card declined").
	RejectedStatus, RejectedReason string
	// Statuses are the status words GET /<Resource>/{key} may answer, as
	// providers.md lists them; any other is an unknown outcome. Empty
	// accepts any word.
	Statuses []string
	// Echo names the request fields a create's 2xx (and a status asked
	// with [Client.StatusFor]) must carry with the same value:
	// "amount_cents" and "currency" for the card processor (providers.md:
	// 201 {"key","charge_id","status":"charged","amount_cents","currency"}).
	Echo []string
	// HTTP is the client used. Defaults to one without a timeout: the
	// deadline comes from ctx.
	HTTP *http.Client
	// DefaultTimeout applies when ctx has no deadline. Defaults to 2 s.
	DefaultTimeout time.Duration
}

// defaultHTTP keeps up to 256 idle connections per company: the default
// transport keeps 2, so under load every other call would open (and leave in
// TIME_WAIT) a new TCP connection.
var defaultHTTP = &http.Client{Transport: &http.Transport{ //nolint:gochecknoglobals // shared connection pool
	Proxy:               http.ProxyFromEnvironment,
	MaxIdleConns:        1024,
	MaxIdleConnsPerHost: 256,
	IdleConnTimeout:     90 * time.Second,
}}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

func (c *Client) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	d := c.DefaultTimeout
	if d == 0 {
		d = 2 * time.Second
	}
	return context.WithTimeout(ctx, d)
}

type answer struct {
	code int
	body map[string]any
}

func (c *Client) do(ctx context.Context, method, path, key string, body any) (answer, error) {
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return answer{}, fmt.Errorf("provider: encode body: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return answer{}, fmt.Errorf("provider: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	tracing.InjectHTTP(ctx, req.Header)
	if err := callFault(ctx, method, fault.BeforeCall); err != nil {
		return answer{}, fmt.Errorf("%w: %s %s: %w", ErrUnknownOutcome, method, path, err)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%w: %s %s: %w", ErrUnknownOutcome, method, path, err)
	}
	defer resp.Body.Close()
	if err := callFault(ctx, method, fault.AnswerUnread); err != nil {
		return answer{}, fmt.Errorf("%w: %s %s: reading answer: %w", ErrUnknownOutcome, method, path, err)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return answer{}, fmt.Errorf("%w: %s %s: reading answer: %w", ErrUnknownOutcome, method, path, err)
	}
	if resp.StatusCode >= 500 {
		return answer{}, fmt.Errorf("%w: %s %s: %d %s", ErrUnknownOutcome, method, path, resp.StatusCode, bytes.TrimSpace(raw))
	}
	a := answer{code: resp.StatusCode, body: map[string]any{}}
	if len(bytes.TrimSpace(raw)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&a.body); err != nil || a.body == nil || dec.More() {
			if err == nil {
				err = errors.New("not one JSON object")
			}
			return answer{}, fmt.Errorf("%w: %s %s: %d with a body that does not parse: %w", ErrUnknownOutcome, method, path, resp.StatusCode, err)
		}
	} else if resp.StatusCode < 300 || resp.StatusCode == http.StatusNotFound {
		// Every 2xx (and a status's 404) of providers.md has a body.
		return answer{}, fmt.Errorf("%w: %s %s: %d without a body", ErrUnknownOutcome, method, path, resp.StatusCode)
	}
	return a, nil
}

// callFault runs the fault point where (internal/fault: before_call,
// answer_unread) of the create or undo the saga has under way in ctx
// (fault.WithSite); a status by key has none.
func callFault(ctx context.Context, method, where string) error {
	if method != http.MethodPost {
		return nil
	}
	return fault.HitSite(ctx, where)
}

// reason returns the company's own words in a 4xx answer: the body's
// "error", "reason" or "status", or the status text.
func (a answer) reason() string {
	for _, k := range []string{"error", "reason", "status"} {
		if why := str(a.body, k); why != "" {
			return why
		}
	}
	return http.StatusText(a.code)
}

// refunded returns the answer's "refunded_cents", 0 when it has none.
func (a answer) refunded() int64 {
	n, _ := a.body["refunded_cents"].(json.Number)
	v, _ := n.Int64()
	return v
}

// checkKey returns an error wrapping [ErrUnknownOutcome] unless the
// answer's "key" is key: a [*MismatchError] when it names another.
func (a answer) checkKey(op, key string) error {
	got, ok := a.body["key"].(string)
	switch {
	case !ok:
		return fmt.Errorf("%w: %s %s: %d answer lacks its key", ErrUnknownOutcome, op, key, a.code)
	case got != key:
		return &MismatchError{Op: op, Field: "key", Want: key, Got: got}
	}
	return nil
}

// checkEcho returns an error wrapping [ErrUnknownOutcome] unless the
// answer carries each [Client.Echo] field of req with req's value: a
// [*MismatchError] when one differs. Fields req lacks are not checked.
func (c *Client) checkEcho(op, key string, req map[string]any, a answer) error {
	for _, f := range c.Echo {
		want, ok := req[f]
		if !ok {
			continue
		}
		got, ok := a.body[f]
		if !ok {
			return fmt.Errorf("%w: %s %s: %d answer lacks %s", ErrUnknownOutcome, op, key, a.code, f)
		}
		if w, g := jsonText(want), jsonText(got); w != g {
			return &MismatchError{Op: op, Field: f, Want: w, Got: g}
		}
	}
	return nil
}

// jsonText is v as JSON text, a string without its quotes.
func jsonText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// requestFields decodes a request body into its top-level fields, for
// [Client.Echo]; nil when body is not a JSON object.
func requestFields(body any) map[string]any {
	b, err := json.Marshal(body)
	if err != nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if dec.Decode(&m) != nil {
		return nil
	}
	return m
}

func str(m map[string]any, k string) string {
	if v, ok := m[k].(string); ok {
		return v
	}
	return ""
}

// Create POSTs body to /<Resource> with the Idempotency-Key key. A deciding
// answer is a Result: Done for a 200/201/202 that names key, the id field
// and the status word [Client.ActiveStatus] (and echoes [Client.Echo]);
// Rejected for 409 (sold out; the insurer's rejected), 402 (declined) and 422 (refused), the
// business answers of providers.md. Anything else is an error wrapping
// [ErrUnknownOutcome]: a [*CredentialsError] for 401/403, a
// [*MismatchError] for a 2xx about another key or amount, a plain one for
// a body that does not parse or lacks its fields, an unknown status word,
// or any other code. The same request may be sent again by the same key.
func (c *Client) Create(ctx context.Context, key string, body any) (res Result, err error) {
	if tracing.Enabled() {
		var end func(*Result, *error)
		ctx, end = c.startSpan(ctx, "create", http.MethodPost, key)
		defer func() { end(&res, &err) }()
	}
	a, err := c.do(ctx, http.MethodPost, "/"+c.Resource, key, body)
	if err != nil {
		return Result{}, err
	}
	r := Result{Code: a.code, Status: str(a.body, "status"), Ref: str(a.body, c.IDField)}
	switch a.code {
	case http.StatusOK, http.StatusCreated, http.StatusAccepted:
		if err := a.checkKey("create", key); err != nil {
			return Result{}, err
		}
		if err := c.checkEcho("create", key, requestFields(body), a); err != nil {
			return Result{}, err
		}
		if r.Ref == "" {
			return Result{}, fmt.Errorf("%w: POST /%s: %d answer lacks %s", ErrUnknownOutcome, c.Resource, a.code, c.IDField)
		}
		if c.ActiveStatus != "" && r.Status != c.ActiveStatus {
			return Result{}, fmt.Errorf("%w: POST /%s: %d answer with status %q, not %q", ErrUnknownOutcome, c.Resource, a.code, r.Status, c.ActiveStatus)
		}
		r.Outcome = Done
	case http.StatusConflict:
		r.Outcome, r.Reason = Rejected, "sold out"
		if r.Status == "rejected" { // the insurer: {"status":"rejected","reason"}
			r.Reason = "insurance rejected"
			if why := str(a.body, "reason"); why != "" {
				r.Reason += ": " + why
			}
		}
	case http.StatusPaymentRequired:
		r.Outcome, r.Reason = Rejected, "card declined"
		if why := str(a.body, "reason"); why != "" && why != r.Reason {
			r.Reason = "card declined: " + strings.TrimPrefix(why, "card declined: ")
		}
	case http.StatusUnprocessableEntity:
		r.Outcome, r.Reason = Rejected, "refused: "+str(a.body, "error")
	case http.StatusUnauthorized, http.StatusForbidden:
		return Result{}, &CredentialsError{Op: "create", Code: a.code, Reason: a.reason()}
	default:
		return Result{}, fmt.Errorf("%w: POST /%s: unexpected %d", ErrUnknownOutcome, c.Resource, a.code)
	}
	return r, nil
}

// Undo POSTs /<Resource>/{key}/<UndoVerb>. It returns Undone for a 200
// naming key with the status word [Client.UndoneStatus], or None for a 200
// {"status":"none"} (the company never saw key: nothing to undo). A 4xx
// other than 408, 425 and 429 (401/403 included) is a [*RefusedError].
// Anything else is an error wrapping [ErrUnknownOutcome]: a
// [*MismatchError] for a 200 naming another key, a plain one for a body
// that does not parse, a status word the contract does not know, or any
// other code.
func (c *Client) Undo(ctx context.Context, key string) (res Result, err error) {
	return c.UndoWith(ctx, key, nil)
}

// UndoWith is [Client.Undo] sending body (nil: none). The card processor's
// refund takes {"amount_cents": N} for a partial refund (providers.md,
// "Partial refunds"); its 200 must then say "refunded_cents": N, or it is
// a [*MismatchError] (a company that ignored the body refunded something
// else than asked).
func (c *Client) UndoWith(ctx context.Context, key string, body any) (res Result, err error) {
	if tracing.Enabled() {
		var end func(*Result, *error)
		op := c.UndoVerb
		if op == "" {
			op = "undo"
		}
		ctx, end = c.startSpan(ctx, op, http.MethodPost, key)
		defer func() { end(&res, &err) }()
	}
	if c.UndoVerb == "" {
		return Result{}, fmt.Errorf("provider: %s cannot be undone", c.Resource)
	}
	a, err := c.do(ctx, http.MethodPost, "/"+c.Resource+"/"+url.PathEscape(key)+"/"+c.UndoVerb, "", body)
	if err != nil {
		return Result{}, err
	}
	if a.code >= 400 && a.code < 500 && a.code != http.StatusRequestTimeout && a.code != http.StatusTooEarly && a.code != http.StatusTooManyRequests {
		return Result{}, &RefusedError{Op: c.UndoVerb, Code: a.code, Reason: a.reason()}
	}
	if a.code != http.StatusOK {
		return Result{}, fmt.Errorf("%w: %s %s: unexpected %d", ErrUnknownOutcome, c.UndoVerb, key, a.code)
	}
	r := Result{Code: a.code, Status: str(a.body, "status"), Ref: str(a.body, c.IDField), RefundedCents: a.refunded()}
	switch {
	case r.Status == "none":
		r.Outcome = None
	case r.Status != "" && (c.UndoneStatus == "" || r.Status == c.UndoneStatus):
		if err := a.checkKey(c.UndoVerb, key); err != nil {
			return Result{}, err
		}
		if want, ok := requestFields(body)["amount_cents"]; ok {
			if got, ok := a.body["refunded_cents"]; !ok || jsonText(want) != jsonText(got) {
				return Result{}, &MismatchError{Op: c.UndoVerb, Field: "refunded_cents", Want: jsonText(want), Got: jsonText(got)}
			}
		}
		r.Outcome = Undone
	default:
		return Result{}, fmt.Errorf("%w: %s %s: 200 answer with status %q, not %q or \"none\"", ErrUnknownOutcome, c.UndoVerb, key, r.Status, c.UndoneStatus)
	}
	return r, nil
}

// Status GETs /<Resource>/{key}: Done with the company's status word when
// it holds a record (a 200 naming key with one of [Client.Statuses]), None
// on 404 {"status":"none"}. Anything else is an error wrapping
// [ErrUnknownOutcome]: a [*CredentialsError] for 401/403, a
// [*MismatchError] for a 200 naming another key, a plain one for a body
// that does not parse or lacks its key, an unknown status word, or any
// other code.
func (c *Client) Status(ctx context.Context, key string) (Result, error) {
	return c.StatusFor(ctx, key, nil)
}

// StatusFor is [Client.Status] checked against the request sent under key:
// a 200 must also echo its [Client.Echo] fields (the amount and currency
// of a charge), or it is a [*MismatchError]. body nil checks nothing more.
func (c *Client) StatusFor(ctx context.Context, key string, body any) (res Result, err error) {
	if tracing.Enabled() {
		var end func(*Result, *error)
		ctx, end = c.startSpan(ctx, "status", http.MethodGet, key)
		defer func() { end(&res, &err) }()
	}
	a, err := c.do(ctx, http.MethodGet, "/"+c.Resource+"/"+url.PathEscape(key), "", nil)
	if err != nil {
		return Result{}, err
	}
	switch a.code {
	case http.StatusOK:
		if err := a.checkKey("status", key); err != nil {
			return Result{}, err
		}
		st := str(a.body, "status")
		if st == "" || (len(c.Statuses) > 0 && !slices.Contains(c.Statuses, st)) {
			return Result{}, fmt.Errorf("%w: GET %s: 200 answer with status %q, not one of %v", ErrUnknownOutcome, key, st, c.Statuses)
		}
		if body != nil {
			if err := c.checkEcho("status", key, requestFields(body), a); err != nil {
				return Result{}, err
			}
		}
		return Result{Outcome: Done, Code: a.code, Status: st, Ref: str(a.body, c.IDField), RefundedCents: a.refunded()}, nil
	case http.StatusNotFound:
		if st := str(a.body, "status"); st != "none" {
			return Result{}, fmt.Errorf("%w: GET %s: 404 answer with status %q, not \"none\"", ErrUnknownOutcome, key, st)
		}
		return Result{Outcome: None, Code: a.code, Status: "none"}, nil
	case http.StatusUnauthorized, http.StatusForbidden:
		return Result{}, &CredentialsError{Op: "status", Code: a.code, Reason: a.reason()}
	}
	return Result{}, fmt.Errorf("%w: GET %s: unexpected %d", ErrUnknownOutcome, key, a.code)
}

// startSpan starts the client span of one call to the company and returns
// the function that ends it with the call's result: its outcome (done,
// rejected, undone, none; "refused" for a [*RefusedError], "unknown" for
// any other error), HTTP status code and reason.
func (c *Client) startSpan(ctx context.Context, op, method, key string) (context.Context, func(*Result, *error)) {
	company := c.Company
	if company == "" {
		company = c.Resource
	}
	ctx, span := tracing.Start(ctx, company+" "+op, trace.SpanKindClient,
		tracing.KeyCompany.String(company), tracing.KeyOperation.String(op), tracing.KeyIdempotencyKey.String(key),
		attribute.String("http.request.method", method))
	return ctx, func(res *Result, err *error) {
		outcome := string(res.Outcome)
		var refused *RefusedError
		switch {
		case *err != nil && errors.As(*err, &refused):
			outcome = "refused"
			span.SetAttributes(attribute.Int("http.response.status_code", refused.Code))
		case *err != nil:
			outcome = "unknown"
		default:
			span.SetAttributes(attribute.Int("http.response.status_code", res.Code), attribute.String("tripsaga.company.status", res.Status))
			if res.Reason != "" {
				span.SetAttributes(attribute.String("tripsaga.reason", res.Reason))
			}
		}
		span.SetAttributes(tracing.KeyOutcome.String(outcome))
		tracing.End(span, *err)
	}
}

// Record is one item of a company's list.
type Record map[string]any

// Key returns the record's Idempotency-Key.
func (r Record) Key() string { return str(r, "key") }

// TripID returns the record's trip id.
func (r Record) TripID() string { return str(r, "trip_id") }

// Status returns the record's status word.
func (r Record) Status() string { return str(r, "status") }

// List pages through GET /<Resource>?status=S (all statuses when status is
// empty), oldest first, and returns every record.
func (c *Client) List(ctx context.Context, status string) ([]Record, error) {
	return c.ListPaced(ctx, status, nil)
}

// ListPaced is [Client.List] with between, when not nil, called after each
// page but the last with how long that page took (request, transfer and
// decoding); an error from it ends the list with that error. The
// reconciler's sweep waits there, so that reading every record of a
// company is a background trickle, not a burst that takes the host's
// cores from the sagas (BENCHMARKS.md, "One trip, hop by hop").
// Pages hold at most 1000 records (providers.md, "Lists for
// reconciliation").
func (c *Client) ListPaced(ctx context.Context, status string, between func(ctx context.Context, page time.Duration) error) ([]Record, error) {
	var out []Record
	after := ""
	for {
		began := time.Now()
		items, next, err := c.listPage(ctx, status, after)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		if next == "" {
			return out, nil
		}
		after = next
		if between != nil {
			if err := between(ctx, time.Since(began)); err != nil {
				return nil, fmt.Errorf("provider: list %s: %w", c.Resource, err)
			}
		}
	}
}

// listPage reads one page of GET /<Resource>: its items and the cursor of
// the next page ("" on the last).
func (c *Client) listPage(ctx context.Context, status, after string) ([]Record, string, error) {
	q := url.Values{"limit": {strconv.Itoa(1000)}}
	if status != "" {
		q.Set("status", status)
	}
	if after != "" {
		q.Set("after", after)
	}
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, c.BaseURL+"/"+c.Resource+"?"+q.Encode(), nil)
	if err != nil {
		return nil, "", err
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("provider: list %s: %w", c.Resource, err)
	}
	defer resp.Body.Close()
	var page struct {
		Items []Record `json:"items"`
		Next  string   `json:"next"`
	}
	err = json.NewDecoder(resp.Body).Decode(&page)
	if resp.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("provider: list %s: %d", c.Resource, resp.StatusCode)
	}
	if err != nil {
		return nil, "", fmt.Errorf("provider: list %s: %w", c.Resource, err)
	}
	return page.Items, page.Next, nil
}

// The four companies, as providers.md names them.

// Hotel returns the client of the hotel at baseURL ($HOTEL_URL).
func Hotel(baseURL string) *Client {
	return &Client{
		Company: "hotel", BaseURL: baseURL, Resource: "holds", IDField: "hold_id", UndoVerb: "release",
		ActiveStatus: "held", UndoneStatus: "released", Statuses: []string{"held", "released"},
	}
}

// Payments returns the client of the card processor ($PAYMENTS_URL).
func Payments(baseURL string) *Client {
	return &Client{
		Company: "payments", BaseURL: baseURL, Resource: "charges", IDField: "charge_id", UndoVerb: "refund",
		ActiveStatus: "charged", UndoneStatus: "refunded", Statuses: []string{"charged", "refunded", "declined"},
		RejectedStatus: "declined", RejectedReason: "card declined",
		Echo: []string{"amount_cents", "currency"},
	}
}

// Cars returns the client of the car firm ($CARS_URL).
func Cars(baseURL string) *Client {
	return &Client{
		Company: "cars", BaseURL: baseURL, Resource: "bookings", IDField: "booking_id", UndoVerb: "cancel",
		ActiveStatus: "booked", UndoneStatus: "canceled", Statuses: []string{"booked", "canceled"},
	}
}

// Insurer returns the client of the travel insurer ($INSURER_URL), the
// company of the optional insurance step.
func Insurer(baseURL string) *Client {
	return &Client{
		Company: "insurer", BaseURL: baseURL, Resource: "policies", IDField: "policy_id", UndoVerb: "cancel",
		ActiveStatus: "active", UndoneStatus: "canceled", Statuses: []string{"active", "canceled"},
	}
}

// Mail returns the client of the mail relay ($MAIL_URL).
func Mail(baseURL string) *Client {
	return &Client{Company: "mail", BaseURL: baseURL, Resource: "messages", IDField: "message_id", ActiveStatus: "queued", Statuses: []string{"queued"}}
}
