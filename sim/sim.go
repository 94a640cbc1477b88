// Package sim simulates the five outside companies the project talks to:
// the hotel, the card processor, the car firm, the mail relay and the
// travel insurer (the optional insurance step's). Each speaks exactly the
// provider contract (docs: contracts/providers.md) over HTTP/JSON and keeps
// its records in its own PostgreSQL schema (sim_hotel, sim_payments,
// sim_cars, sim_mail, sim_insurer), so records survive a restart; or, with
// Config.Memory, in memory (for benchmarks).
//
// One [http.Handler] serves all five under path prefixes:
//
//	HOTEL_URL=http://127.0.0.1:PORT/hotel
//	PAYMENTS_URL=http://127.0.0.1:PORT/payments
//	CARS_URL=http://127.0.0.1:PORT/cars
//	MAIL_URL=http://127.0.0.1:PORT/mail
//	INSURER_URL=http://127.0.0.1:PORT/insurer
//
// Each company also accepts fault rules at <prefix>/_faults (see [Rule]),
// so tests and the demo can make it sell out, decline, fail, lose answers,
// hang, commit late or answer slowly, or misbehave: answer a body that does
// not parse, another key, another amount, an unknown status word, or 401. [AddFault] and [ClearFaults] are a
// small client for them. A rule with a Chance applies to a matching call
// only with that probability (our test extension for `tripsaga chaos`,
// never the default); [AddFaultRule] returns a rule's ID and
// [RemoveFault] removes that one rule (DELETE <prefix>/_faults/{id}).
// Fault rules live in memory: a restart forgets them, while records stay.
//
// Beyond the contract, and safe for callers to ignore: every list also takes
// trip_id; resources carry created_at and updated_at (RFC 3339, UTC); a
// statement line also carries the charge's key and currency; a hang that
// outlives its delay answers 504 {"error":"timeout"}; card token
// [DeclinedCardToken] is always declined.
package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tripsaga/tripsaga/internal/httpx"
	"github.com/tripsaga/tripsaga/internal/redact"
	"github.com/tripsaga/tripsaga/sim/internal/dbsqlc"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// Config configures [New].
type Config struct {
	// DatabaseURL is the PostgreSQL database holding the companies' schemas.
	// Required unless Memory is set.
	DatabaseURL string
	// Memory keeps the records in this process's memory instead of
	// PostgreSQL: nothing survives a restart, and the database spends no
	// CPU on the companies (for benchmarks).
	Memory bool
	// Logger receives request and fault logs. Nil discards them.
	Logger *slog.Logger
}

// Simulators are the five company simulators. Create them with [New], serve
// [Simulators.Handler], and [Simulators.Close] them when done.
type Simulators struct {
	log       *slog.Logger
	companies []*company
	handler   http.Handler

	baseCtx context.Context // canceled by Close; late commits run under it
	cancel  context.CancelFunc
	closing chan struct{} // closed by Close: hanging handlers stop waiting

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // late commits in flight

	// lateCommits counts the commit_late operations performed (see
	// [Simulators.LateCommits]).
	lateCommits atomic.Int64
}

// LateCommits returns how many commit_late operations (providers.md: the
// company commits after the caller gave up) have been performed so far,
// by every company: a late commit changes nothing a caller can read when
// it replays an answer already given, so this is how to know it happened.
func (s *Simulators) LateCommits() int64 { return s.lateCommits.Load() }

// New migrates the five company schemas (sim_hotel, sim_payments, sim_cars,
// sim_mail, sim_insurer) in cfg.DatabaseURL, opens one connection pool per company and
// returns the simulators. Records already in the database are kept. With
// cfg.Memory it touches no database and starts with no records.
func New(ctx context.Context, cfg Config) (*Simulators, error) {
	if cfg.DatabaseURL == "" && !cfg.Memory {
		return nil, errors.New("sim: Config.DatabaseURL is required (or Config.Memory)")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	baseCtx, cancel := context.WithCancel(context.Background())
	s := &Simulators{
		log:     log,
		baseCtx: baseCtx,
		cancel:  cancel,
		closing: make(chan struct{}),
	}
	for _, sp := range specs() {
		if cfg.Memory {
			s.companies = append(s.companies, newCompany(s, sp, newMemStore()))
			continue
		}
		c, err := s.openCompany(ctx, cfg.DatabaseURL, sp)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.companies = append(s.companies, c)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.handleHealthz)
	for _, c := range s.companies {
		c.register(mux)
	}
	s.handler = s.logRequests(mux)
	return s, nil
}

func (s *Simulators) openCompany(ctx context.Context, databaseURL string, sp *spec) (*company, error) {
	if err := tripsql.Migrate(ctx, databaseURL, sp.schema, tripsql.SetSim); err != nil {
		return nil, fmt.Errorf("sim %s: %w", sp.name, err)
	}
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("sim %s: DatabaseURL: %w", sp.name, err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = sp.schema
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("sim %s: open pool: %w", sp.name, err)
	}
	return newCompany(s, sp, &pgStore{pool: pool, q: dbsqlc.New()}), nil
}

// Handler serves the five companies under /hotel, /payments, /cars,
// /mail and /insurer, and GET /healthz at the root.
func (s *Simulators) Handler() http.Handler { return s.handler }

// Close stops the simulators: hanging and slow handlers stop waiting,
// pending late commits are dropped (as if the company crashed before
// committing them), and the connection pools are closed. It is safe to call
// more than once.
func (s *Simulators) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	for _, c := range s.companies {
		c.store.close()
	}
}

// goLate runs fn in a goroutine tracked by Close. It returns false, without
// running fn, once Close has begun.
func (s *Simulators) goLate(fn func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
	return true
}

func (s *Simulators) handleHealthz(w http.ResponseWriter, r *http.Request) {
	for _, c := range s.companies {
		if err := c.store.ping(r.Context()); err != nil {
			s.log.WarnContext(r.Context(), "sim healthz", "company", c.sp.name, "error", err)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "company": c.sp.name})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// logRequests logs every request once, at debug level.
// logPath is path as the request log shows it: the card token of
// GET /payments/statements/{card_token} masked (redact.Token).
func logPath(path string) string {
	if before, card, ok := strings.Cut(path, "/statements/"); ok {
		return before + "/statements/" + redact.Token(card)
	}
	return path
}

func (s *Simulators) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &httpx.StatusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		s.log.DebugContext(r.Context(), "sim request",
			"method", r.Method,
			"path", logPath(r.URL.Path),
			"idempotency_key", r.Header.Get("Idempotency-Key"),
			"status", rec.Status, // 0: no answer (lost, hung or hijacked)
			"duration_ms", time.Since(start).Milliseconds())
	})
}
