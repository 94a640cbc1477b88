package process

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
)

// Problem is an RFC 9457 problem details object, served as
// application/problem+json by every process's API.
type Problem struct {
	Type     string              `json:"type"`
	Title    string              `json:"title"`
	Status   int                 `json:"status"`
	Detail   string              `json:"detail,omitempty"`
	Instance string              `json:"instance,omitempty"`
	Errors   []events.FieldError `json:"errors,omitempty"` // extension member: every invalid field
}

// Problem types of the processes' APIs (trips-api.md).
const (
	ProblemUnavailable  = "https://tripsaga.io/problems/unavailable"
	ProblemInvalidInput = "https://tripsaga.io/problems/invalid-input"
	ProblemInternal     = "https://tripsaga.io/problems/internal"
	ProblemNotFound     = "https://tripsaga.io/problems/not-found"
)

// RetryAfterSeconds is the Retry-After (RFC 9110 §10.2.3) of a 503 answered
// while PostgreSQL or NATS is unreachable.
const RetryAfterSeconds = 2

// WriteProblem writes p as application/problem+json with status p.Status.
func WriteProblem(w http.ResponseWriter, p Problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	if p.Status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// WriteNotFound writes a 404 problem for r's path.
func WriteNotFound(w http.ResponseWriter, r *http.Request, title string) {
	WriteProblem(w, Problem{Type: ProblemNotFound, Title: title, Status: http.StatusNotFound, Instance: r.URL.EscapedPath()})
}

// WriteError answers an error a handler did not expect, never with the
// error's text (it may be PostgreSQL's, quoting the input): 503 with
// Retry-After when [Unavailable] says PostgreSQL or NATS cannot be
// reached; 400 when PostgreSQL refused a value as data (SQLSTATE class 22,
// e.g. a NUL or a byte that is not UTF-8, which validation should have
// caught); 500 otherwise. The error is logged, at warning level for a 503.
func WriteError(w http.ResponseWriter, r *http.Request, log *slog.Logger, what string, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var pgErr *pgconn.PgError
	switch {
	case r.Context().Err() != nil && errors.Is(err, r.Context().Err()):
		// The client went away: nobody reads the answer.
		log.Debug(what+": request ended", "path", r.URL.EscapedPath(), "err", err)
		WriteProblem(w, Problem{Type: ProblemUnavailable, Title: "Request ended", Status: http.StatusServiceUnavailable})
	case Unavailable(err):
		log.Warn(what+": a dependency is unavailable", "path", r.URL.EscapedPath(), "err", err)
		WriteProblem(w, Problem{Type: ProblemUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
			Detail: "PostgreSQL or NATS cannot be reached; retry after " + strconv.Itoa(RetryAfterSeconds) + " s"})
	case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22"):
		log.Error(what+": the database refused a value", "path", r.URL.EscapedPath(), "err", err)
		WriteProblem(w, Problem{Type: ProblemInvalidInput, Title: "Invalid input", Status: http.StatusBadRequest,
			Detail: "the request holds a value that cannot be stored or looked up (control characters or bytes that are not UTF-8?)"})
	default:
		log.Error(what, "path", r.URL.EscapedPath(), "err", err)
		WriteProblem(w, Problem{Type: ProblemInternal, Title: "Internal error", Status: http.StatusInternalServerError})
	}
}

// Unavailable reports whether err says PostgreSQL or NATS cannot be reached
// now, so that a retry later may work: a failed or broken connection, a
// timeout, a closed pool, PostgreSQL's SQLSTATE class 08 (connection
// exception), 53300 (too many connections), 57P01 to 57P03 (shutting down,
// crashed, starting up), or NATS disconnected, closed or without a server.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		c := pgErr.Code
		return strings.HasPrefix(c, "08") || c == "53300" || c == "57P01" || c == "57P02" || c == "57P03"
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connectErr), errors.As(err, &netErr),
		pgconn.SafeToRetry(err), pgconn.Timeout(err),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, puddle.ErrClosedPool),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrConnectionDraining), errors.Is(err, nats.ErrNoServers),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse):
		return true
	}
	return false
}

// Guard answers every request but the operational ones (/healthz,
// /readyz, /metrics, /debug/) with 503 problem+json and Retry-After while
// nc (nil: no NATS) is not connected: a process's API needs both NATS and
// PostgreSQL, and a PostgreSQL outage is answered the same way by
// [WriteError].
func Guard(nc *nats.Conn, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if nc != nil && !nc.IsConnected() && !isOps(r.URL.Path) {
			WriteProblem(w, Problem{Type: ProblemUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
				Detail: "NATS cannot be reached; retry after " + strconv.Itoa(RetryAfterSeconds) + " s"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

func isOps(path string) bool {
	switch path {
	case "/healthz", "/readyz", "/metrics":
		return true
	}
	return strings.HasPrefix(path, "/debug/")
}

// Problems serves mux, answering a path it has no pattern for with 404
// problem+json and a method it does not serve there with 405 problem+json
// (with the Allow header ServeMux sets), instead of ServeMux's plain text.
func Problems(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		c := &statusCapture{header: http.Header{}}
		h.ServeHTTP(c, r)
		switch c.status {
		case http.StatusNotFound:
			WriteNotFound(w, r, "Not found")
		case http.StatusMethodNotAllowed:
			w.Header().Set("Allow", c.header.Get("Allow"))
			WriteProblem(w, Problem{Type: "about:blank", Title: "Method not allowed", Status: http.StatusMethodNotAllowed, Instance: r.URL.EscapedPath()})
		default: // a redirect to the canonical path
			for k, v := range c.header {
				w.Header()[k] = v
			}
			w.WriteHeader(c.status)
		}
	})
}

// statusCapture records the status and headers of a ServeMux's own answer.
type statusCapture struct {
	header http.Header
	status int
}

func (c *statusCapture) Header() http.Header { return c.header }

func (c *statusCapture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return len(b), nil
}

func (c *statusCapture) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}
