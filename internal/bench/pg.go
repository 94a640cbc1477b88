package bench

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// benchRole is the PostgreSQL role of the bench's own monitoring
// connection: pg_stat_statements figures leave its statements out, and its
// transactions are subtracted from the database's counters.
const benchRole = "tripsaga_bench"

// txControl matches statements that only begin or end a transaction.
// (PostgreSQL's regular expressions spell a word end \M, not \b.)
const txControl = `'^\s*(begin|commit|rollback|start transaction|end)\M'`

// pgMeter reads the counters of the database the services use.
type pgMeter struct {
	conn *pgx.Conn
	db   string
	own  int64 // transactions run by conn
}

// pgSample: transactions (commits + rollbacks) of the database so far, and
// the statements pg_stat_statements counted since the last reset (the
// bench's own left out), all and without transaction control.
type pgSample struct {
	xacts, stmts, stmtsNoTx int64
	own                     int64
}

func (m *pgMeter) exec(ctx context.Context, sql string, args ...any) error {
	m.own++
	_, err := m.conn.Exec(ctx, sql, args...)
	return err
}

// reset zeroes pg_stat_statements.
func (m *pgMeter) reset(ctx context.Context) error {
	if err := m.exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		return fmt.Errorf("bench: pg_stat_statements_reset: %w", err)
	}
	return nil
}

func (m *pgMeter) sample(ctx context.Context) (pgSample, error) {
	var s pgSample
	m.own++
	_, _ = m.conn.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	m.own++
	err := m.conn.QueryRow(ctx, `
SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1),
       coalesce(sum(calls), 0)::bigint,
       coalesce(sum(calls) FILTER (WHERE lower(query) !~ `+txControl+`), 0)::bigint
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1 AND s.userid <> (SELECT oid FROM pg_roles WHERE rolname = current_user)`, m.db).Scan(&s.xacts, &s.stmts, &s.stmtsNoTx)
	if err != nil {
		return s, fmt.Errorf("bench: PostgreSQL counters: %w", err)
	}
	s.own = m.own
	return s, nil
}

// Statement is one statement of the services, with its calls per trip.
type Statement struct {
	Query        string  `json:"query"`
	CallsPerTrip float64 `json:"calls_per_trip"`
	// TotalMSPerTrip is the time PostgreSQL spent executing it, ms per trip.
	TotalMSPerTrip float64 `json:"total_ms_per_trip"`
}

// top returns the most called statements since the last reset.
func (m *pgMeter) top(ctx context.Context, trips, limit int) ([]Statement, error) {
	m.own++
	rows, err := m.conn.Query(ctx, `
SELECT regexp_replace(query, '\s+', ' ', 'g'), calls, total_exec_time
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1 AND s.userid <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
ORDER BY calls DESC, total_exec_time DESC LIMIT $2`, m.db, limit)
	if err != nil {
		return nil, fmt.Errorf("bench: top statements: %w", err)
	}
	defer rows.Close()
	var out []Statement
	for rows.Next() {
		var q string
		var calls int64
		var ms float64
		if err := rows.Scan(&q, &calls, &ms); err != nil {
			return nil, fmt.Errorf("bench: top statements: %w", err)
		}
		q = shortQuery(q)
		out = append(out, Statement{Query: q, CallsPerTrip: round(float64(calls)/float64(trips), 2), TotalMSPerTrip: round(ms/float64(trips), 3)})
	}
	return out, rows.Err()
}

// settings returns the PostgreSQL settings that decide durability and
// size, in a fixed order.
func (m *pgMeter) settings(ctx context.Context) ([]Setting, error) {
	names := []string{"server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_level", "shared_buffers", "max_connections", "shared_preload_libraries"}
	var out []Setting
	for _, n := range names {
		var v string
		m.own++
		if err := m.conn.QueryRow(ctx, "SELECT current_setting($1)", n).Scan(&v); err != nil {
			return nil, fmt.Errorf("bench: setting %s: %w", n, err)
		}
		out = append(out, Setting{Name: n, Value: v})
	}
	return out, nil
}

// Setting is one PostgreSQL setting.
type Setting struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// reconcilerSettled counts the trips of ids that the reconciler's view has
// settled as confirmed and mailed.
func (m *pgMeter) reconcilerSettled(ctx context.Context, ids []string) (int, error) {
	var n int
	m.own++
	err := m.conn.QueryRow(ctx, `SELECT count(*) FROM reconciler.trip_view WHERE trip_id = ANY($1) AND settled = 'confirmed' AND mailed`, ids).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("bench: reconciler view: %w", err)
	}
	return n, nil
}

// Lag is how long after its last event was made the reconciler had applied
// it, over the trips of a run, ms.
type Lag struct {
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

func (m *pgMeter) reconcilerLag(ctx context.Context, ids []string) (Lag, error) {
	var l Lag
	m.own++
	err := m.conn.QueryRow(ctx, `
SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 0),
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 0),
       coalesce(max(ms), 0)
FROM (SELECT extract(epoch FROM updated_at - last_event_at) * 1000 AS ms
      FROM reconciler.trip_view WHERE trip_id = ANY($1)) t`, ids).Scan(&l.P50, &l.P99, &l.Max)
	if err != nil {
		return l, fmt.Errorf("bench: reconciler lag: %w", err)
	}
	l.P50, l.P99, l.Max = round(l.P50, 1), round(l.P99, 1), round(l.Max, 1)
	return l, nil
}

// shortQuery names a sqlc query by its name ("-- name: TripGet :one SELECT
// ..." becomes "TripGet: SELECT ...") and cuts it to 120 characters.
func shortQuery(q string) string {
	if rest, ok := strings.CutPrefix(q, "-- name: "); ok {
		if name, tail, ok := strings.Cut(rest, " "); ok {
			if _, sql, ok := strings.Cut(tail, " "); ok && strings.HasPrefix(tail, ":") {
				q = name + ": " + sql
			}
		}
	}
	if r := []rune(q); len(r) > 120 {
		q = string(r[:117]) + "..."
	}
	return q
}
