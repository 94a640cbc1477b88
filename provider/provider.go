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
	"strconv"
	"strings"
	"time"
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
var ErrUnknownOutcome = errors.New("provider: outcome unknown")

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
}

// Client calls one company.
type Client struct {
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
	// need undoing: "held", "charged", "booked", "queued".
	ActiveStatus string
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
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%w: %s %s: %w", ErrUnknownOutcome, method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return answer{}, fmt.Errorf("%w: %s %s: reading answer: %w", ErrUnknownOutcome, method, path, err)
	}
	if resp.StatusCode >= 500 {
		return answer{}, fmt.Errorf("%w: %s %s: %d %s", ErrUnknownOutcome, method, path, resp.StatusCode, bytes.TrimSpace(raw))
	}
	a := answer{code: resp.StatusCode, body: map[string]any{}}
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			return answer{}, fmt.Errorf("%w: %s %s: %d with a body that is not JSON: %w", ErrUnknownOutcome, method, path, resp.StatusCode, err)
		}
	}
	return a, nil
}

func str(m map[string]any, k string) string {
	if v, ok := m[k].(string); ok {
		return v
	}
	return ""
}

// Create POSTs body to /<Resource> with the Idempotency-Key key. A deciding
// answer is a Result (Done or Rejected); anything else is an error wrapping
// [ErrUnknownOutcome].
func (c *Client) Create(ctx context.Context, key string, body any) (Result, error) {
	a, err := c.do(ctx, http.MethodPost, "/"+c.Resource, key, body)
	if err != nil {
		return Result{}, err
	}
	r := Result{Code: a.code, Status: str(a.body, "status"), Ref: str(a.body, c.IDField)}
	switch a.code {
	case http.StatusOK, http.StatusCreated, http.StatusAccepted:
		r.Outcome = Done
	case http.StatusConflict:
		r.Outcome, r.Reason = Rejected, "sold out"
	case http.StatusPaymentRequired:
		r.Outcome, r.Reason = Rejected, "card declined"
		if why := str(a.body, "reason"); why != "" && why != r.Reason {
			r.Reason = "card declined: " + strings.TrimPrefix(why, "card declined: ")
		}
	case http.StatusUnprocessableEntity:
		r.Outcome, r.Reason = Rejected, "refused: "+str(a.body, "error")
	default:
		return Result{}, fmt.Errorf("%w: POST /%s: unexpected %d", ErrUnknownOutcome, c.Resource, a.code)
	}
	return r, nil
}

// Undo POSTs /<Resource>/{key}/<UndoVerb>. It returns Undone, or None when
// the company never saw key (nothing to undo); a 4xx refusal is a
// [*RefusedError]; anything else is an error wrapping [ErrUnknownOutcome].
func (c *Client) Undo(ctx context.Context, key string) (Result, error) {
	if c.UndoVerb == "" {
		return Result{}, fmt.Errorf("provider: %s cannot be undone", c.Resource)
	}
	a, err := c.do(ctx, http.MethodPost, "/"+c.Resource+"/"+url.PathEscape(key)+"/"+c.UndoVerb, "", nil)
	if err != nil {
		return Result{}, err
	}
	if a.code >= 400 && a.code < 500 && a.code != http.StatusRequestTimeout && a.code != http.StatusTooEarly && a.code != http.StatusTooManyRequests {
		why := str(a.body, "error")
		if why == "" {
			why = str(a.body, "reason")
		}
		if why == "" {
			why = str(a.body, "status")
		}
		if why == "" {
			why = http.StatusText(a.code)
		}
		return Result{}, &RefusedError{Op: c.UndoVerb, Code: a.code, Reason: why}
	}
	if a.code != http.StatusOK {
		return Result{}, fmt.Errorf("%w: %s %s: unexpected %d", ErrUnknownOutcome, c.UndoVerb, key, a.code)
	}
	r := Result{Code: a.code, Status: str(a.body, "status"), Ref: str(a.body, c.IDField)}
	if r.Status == "none" {
		r.Outcome = None
	} else {
		r.Outcome = Undone
	}
	return r, nil
}

// Status GETs /<Resource>/{key}: Done with the company's status word when
// it holds a record, None on 404.
func (c *Client) Status(ctx context.Context, key string) (Result, error) {
	a, err := c.do(ctx, http.MethodGet, "/"+c.Resource+"/"+url.PathEscape(key), "", nil)
	if err != nil {
		return Result{}, err
	}
	switch a.code {
	case http.StatusOK:
		return Result{Outcome: Done, Code: a.code, Status: str(a.body, "status"), Ref: str(a.body, c.IDField)}, nil
	case http.StatusNotFound:
		return Result{Outcome: None, Code: a.code, Status: "none"}, nil
	}
	return Result{}, fmt.Errorf("%w: GET %s: unexpected %d", ErrUnknownOutcome, key, a.code)
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
	var out []Record
	after := ""
	for {
		q := url.Values{"limit": {strconv.Itoa(1000)}}
		if status != "" {
			q.Set("status", status)
		}
		if after != "" {
			q.Set("after", after)
		}
		rctx, cancel := c.ctx(ctx)
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, c.BaseURL+"/"+c.Resource+"?"+q.Encode(), nil)
		if err != nil {
			cancel()
			return nil, err
		}
		resp, err := c.httpClient().Do(req)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("provider: list %s: %w", c.Resource, err)
		}
		var page struct {
			Items []Record `json:"items"`
			Next  string   `json:"next"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("provider: list %s: %d", c.Resource, resp.StatusCode)
		}
		if err != nil {
			return nil, fmt.Errorf("provider: list %s: %w", c.Resource, err)
		}
		out = append(out, page.Items...)
		if page.Next == "" {
			return out, nil
		}
		after = page.Next
	}
}

// The four companies, as providers.md names them.

// Hotel returns the client of the hotel at baseURL ($HOTEL_URL).
func Hotel(baseURL string) *Client {
	return &Client{BaseURL: baseURL, Resource: "holds", IDField: "hold_id", UndoVerb: "release", ActiveStatus: "held"}
}

// Payments returns the client of the card processor ($PAYMENTS_URL).
func Payments(baseURL string) *Client {
	return &Client{BaseURL: baseURL, Resource: "charges", IDField: "charge_id", UndoVerb: "refund", ActiveStatus: "charged"}
}

// Cars returns the client of the car firm ($CARS_URL).
func Cars(baseURL string) *Client {
	return &Client{BaseURL: baseURL, Resource: "bookings", IDField: "booking_id", UndoVerb: "cancel", ActiveStatus: "booked"}
}

// Mail returns the client of the mail relay ($MAIL_URL).
func Mail(baseURL string) *Client {
	return &Client{BaseURL: baseURL, Resource: "messages", IDField: "message_id", ActiveStatus: "queued"}
}
