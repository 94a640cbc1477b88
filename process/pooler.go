package process

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrTransactionPooler is wrapped by [CheckSession]'s error when
// DATABASE_URL reaches PostgreSQL through a connection pooler that hands a
// client's statements to different server sessions (PgBouncer's
// pool_mode = transaction or statement).
var ErrTransactionPooler = errors.New("DATABASE_URL reaches PostgreSQL through a connection pooler in transaction or statement pooling mode (PgBouncer pool_mode = transaction or statement)")

// sessionCheckSetting is the custom setting [CheckSession] writes at
// session level (PostgreSQL docs, "Customized Options": a name with a dot
// is any extension's, and set_config(..., false) keeps it for the session).
const sessionCheckSetting = "tripsaga.session_check"

// CheckSession refuses a databaseURL whose connections do not keep their
// PostgreSQL session: every process needs one for what outlives a
// transaction, namely its liveness's session advisory lock
// (saga/liveness.go: a peer takes a dead replica's leases when its lock is
// free, so a lock held by a pooled backend that outlives the replica, or
// two replicas' locks on one backend, breaks the lease rule), LISTEN for
// pg_notify (the outbox relay's wake-up, trips' Prefer: wait), the
// migrations' session lock (goose) and search_path (set once per
// connection) and pgx's prepared statements.
//
// The test: two client connections each write their own value of a
// session-level setting, one after the other, and then the first reads it
// back, with its backend pid before and after. On PostgreSQL itself or
// behind a pooler in session mode (PgBouncer pool_mode = session, which
// works) the first reads its own value on the same backend; behind
// PgBouncer in transaction or statement mode the second connection's
// statement ran on the server session the first had just released (or on
// one that was reset), so the value or the pid differs. Statements are
// sent with the simple protocol, which every pooler passes.
//
// Errors: one wrapping [ErrTransactionPooler], naming what to set; a
// connection error, named for a pooler when the server refuses a startup
// parameter (PgBouncer refuses those it does not track, such as
// search_path, unless its ignore_startup_parameters lists them).
func CheckSession(ctx context.Context, databaseURL string) error {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	a, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return poolerConnectError(err)
	}
	defer a.Close(context.Background())
	b, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return poolerConnectError(err)
	}
	defer b.Close(context.Background())
	var pidBefore, pidAfter int32
	var mine string
	if err := a.QueryRow(ctx, "SELECT pg_backend_pid(), set_config($1, 'a', false)", sessionCheckSetting).Scan(&pidBefore, new(string)); err != nil {
		return fmt.Errorf("postgres: the session check: %w", err)
	}
	if _, err := b.Exec(ctx, "SELECT set_config($1, 'b', false)", sessionCheckSetting); err != nil {
		return fmt.Errorf("postgres: the session check: %w", err)
	}
	if err := a.QueryRow(ctx, "SELECT pg_backend_pid(), coalesce(current_setting($1, true), '')", sessionCheckSetting).Scan(&pidAfter, &mine); err != nil {
		return fmt.Errorf("postgres: the session check: %w", err)
	}
	if pidBefore != pidAfter || mine != "a" {
		return fmt.Errorf("refusing to start: %w: a session's state does not outlive its transaction there (one connection's statements ran on server backends %d and %d, and its session setting read back %q, not %q), and tripsaga needs a session of its own for each process's liveness advisory lock, LISTEN, the migrations' lock, search_path and prepared statements; point DATABASE_URL at PostgreSQL itself, or at a pool in session mode (PgBouncer: pool_mode = session for this database in pgbouncer.ini)",
			ErrTransactionPooler, pidBefore, pidAfter, mine, "a")
	}
	return nil
}

// poolerConnectError names the pooler when a connection was refused for
// a startup parameter, as PgBouncer refuses those it does not track.
func poolerConnectError(err error) error {
	if strings.Contains(err.Error(), "unsupported startup parameter") {
		return fmt.Errorf("postgres: DATABASE_URL reaches a connection pooler (PgBouncer?) that refuses a startup parameter of the URL: remove it from DATABASE_URL or list it in the pooler's ignore_startup_parameters (tripsaga itself sends only application_name and sets search_path after connecting): %w", err)
	}
	return fmt.Errorf("postgres: %w", err)
}
