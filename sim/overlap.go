package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// Overlap counts, for `tripsaga chaos` and the replica tests (our own test
// extension, outside providers.md), the writes (create and undo) that
// arrived while another write of the same Idempotency-Key was still in
// flight from a caller still waiting for its answer. A caller that gave up
// (its connection closed) no longer counts, so a retry after a timeout is
// not an overlap; two replicas calling for one key at once are.
type overlap struct {
	mu       sync.Mutex
	inFlight map[string]int
	overlaps atomic.Int64
	maxSeen  atomic.Int64
	writes   atomic.Int64
	log      *slog.Logger
}

// Stats is the answer of GET <company>/_stats.
type Stats struct {
	// OverlappingCalls counts writes that arrived while another write of
	// the same key was in flight (its caller still waiting).
	OverlappingCalls int64 `json:"overlapping_calls"`
	// MaxInFlightPerKey is the most writes of one key seen in flight at
	// once (1 when there was never an overlap, 0 before any write).
	MaxInFlightPerKey int64 `json:"max_in_flight_per_key"`
	// Writes counts every write (create and undo) the company received,
	// since the simulator started: a replay that calls no company leaves
	// it as it was.
	Writes int64 `json:"writes"`
}

// track wraps a write handler keyed by key(r).
func (o *overlap) track(key func(*http.Request) string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		o.writes.Add(1)
		k := key(r)
		if k == "" {
			h(w, r)
			return
		}
		o.mu.Lock()
		if o.inFlight == nil {
			o.inFlight = map[string]int{}
		}
		o.inFlight[k]++
		n := int64(o.inFlight[k])
		o.mu.Unlock()
		if n > 1 {
			o.overlaps.Add(1)
			if o.log != nil {
				o.log.Warn("sim: a write arrived while another of its Idempotency-Key was in flight", "key", k, "method", r.Method, "path", r.URL.Path, "in_flight", n)
			}
		}
		for {
			m := o.maxSeen.Load()
			if n <= m || o.maxSeen.CompareAndSwap(m, n) {
				break
			}
		}
		var once sync.Once
		leave := func() {
			once.Do(func() {
				o.mu.Lock()
				if o.inFlight[k]--; o.inFlight[k] <= 0 {
					delete(o.inFlight, k)
				}
				o.mu.Unlock()
			})
		}
		// The caller gave up: its write no longer counts as in flight.
		stop := context.AfterFunc(r.Context(), leave)
		defer stop()
		defer leave()
		h(&trackedWriter{ResponseWriter: w, leave: leave}, r)
	}
}

// trackedWriter ends a write's time in flight before its connection is
// hijacked to be closed without an answer (lose_answer): the caller sees
// the close at once and may send the same key again (Go's transport does,
// by itself, for a request with an Idempotency-Key on a reused
// connection), which is a retry, not an overlap. An answer that is
// written is flushed after the handler returns, so after the deferred
// leave.
type trackedWriter struct {
	http.ResponseWriter
	leave func()
}

func (t *trackedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	t.leave()
	return http.NewResponseController(t.ResponseWriter).Hijack()
}

// Unwrap lets http.NewResponseController reach the server's writer.
func (t *trackedWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

func (o *overlap) stats() Stats {
	return Stats{OverlappingCalls: o.overlaps.Load(), MaxInFlightPerKey: o.maxSeen.Load(), Writes: o.writes.Load()}
}

func (c *company) handleStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, c.overlap.stats())
}

// GetStats reads GET <companyBaseURL>/_stats (e.g.
// http://127.0.0.1:8080/payments/_stats). Errors: the request failed or
// the answer is not 200 with a [Stats] body.
func GetStats(ctx context.Context, companyBaseURL string) (Stats, error) {
	var st Stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(companyBaseURL, "/")+"/_stats", nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("sim: stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("sim: stats: %s answered %d", companyBaseURL, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("sim: stats: %w", err)
	}
	return st, nil
}
