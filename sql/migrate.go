// Package sql holds the project's SQL: the migrations of every schema
// (sql/migrations/<set>) and the named queries that sqlc turns into Go
// (sql/queries/<package>, configured by sqlc.yaml at the top of the module).
//
// Each service keeps its tables in its own PostgreSQL schema. A migration
// set is written with unqualified table names and applied with search_path
// set to the target schema, so one set (saga: outbox, inbox, step log,
// incidents) serves every service.
package sql

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations
var migrations embed.FS

// Migration sets. Each is applied with its own goose version table
// (goose_<set>) inside the target schema.
const (
	SetSaga       = "saga"       // outbox, inbox, step log, incidents: every service
	SetTrips      = "trips"      // the trips service's own tables
	SetSim        = "sim"        // one company simulator's records
	SetReconciler = "reconciler" // the reconciler's projection
)

// SimSchemaPrefix starts the schema of each company simulator (set
// [SetSim]): sim_hotel, sim_payments... The simulators' role makes them
// (internal/pgroles).
const SimSchemaPrefix = "sim_"

// Migrate creates schema if it is missing and applies the given migration
// sets to it, in order, with search_path set to schema, as the user of
// databaseURL: a service's own role (internal/pgroles), which owns the
// schema and so every object the migrations create (a user who is not the
// schema's owner but may act as it, a superuser, migrates as the owner). A
// PostgreSQL advisory
// lock per (schema, set) lets several processes call it at once. Errors
// never hold databaseURL's password (pgx redacts it in parse errors).
func Migrate(ctx context.Context, databaseURL, schema string, sets ...string) error {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("migrate: DATABASE_URL: %w", err)
	}
	setPath := SetSearchPath(schema)
	db := stdlib.OpenDB(*cfg, stdlib.OptionAfterConnect(setPath))
	defer db.Close()
	// A service's role owns its schema but may not create one (the
	// bootstrap, internal/pgroles, made it): create only a missing schema.
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema).Scan(&n); err != nil {
		return fmt.Errorf("migrate: schema %s: %w", schema, err)
	}
	if n == 0 {
		if _, err := db.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
			// Two processes creating the same schema at once may race; re-check.
			if qerr := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema).Scan(&n); qerr != nil || n == 0 {
				return fmt.Errorf("migrate: create schema %s: %w", schema, err)
			}
		}
	}
	// A schema owned by another role than the URL's user (an operator's
	// tool run with the administrator's URL, e.g. tripsaga replay) is
	// migrated as its owner (SET ROLE), when the user may: the objects stay
	// the owner's, whoever ran the migration.
	var owner string
	var asOwner bool
	if err := db.QueryRowContext(ctx, `SELECT pg_get_userbyid(nspowner), nspowner <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
		AND pg_has_role(current_user, nspowner, 'MEMBER') FROM pg_namespace WHERE nspname = $1`, schema).Scan(&owner, &asOwner); err != nil {
		return fmt.Errorf("migrate: schema %s: %w", schema, err)
	}
	if asOwner {
		db.Close()
		setRole := "SET ROLE " + pgx.Identifier{owner}.Sanitize()
		db = stdlib.OpenDB(*cfg, stdlib.OptionAfterConnect(func(ctx context.Context, c *pgx.Conn) error {
			if err := setPath(ctx, c); err != nil {
				return err
			}
			_, err := c.Exec(ctx, setRole)
			return err
		}))
		defer db.Close()
	}
	for _, set := range sets {
		if err := migrateSet(ctx, db, schema, set); err != nil {
			return err
		}
	}
	return nil
}

// SetSearchPath returns a connection hook (pgxpool.Config.AfterConnect,
// stdlib.OptionAfterConnect) that sets the session's search_path to
// schema. It is set after connecting rather than as a startup parameter,
// which a connection pooler in session mode may refuse (PgBouncer 1.18:
// "unsupported startup parameter: search_path").
func SetSearchPath(schema string) func(context.Context, *pgx.Conn) error {
	stmt := "SET search_path TO " + pgx.Identifier{schema}.Sanitize()
	return func(ctx context.Context, c *pgx.Conn) error {
		if _, err := c.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("set search_path to %s: %w", schema, err)
		}
		return nil
	}
}

func migrateSet(ctx context.Context, db *sql.DB, schema, set string) error {
	sub, err := fs.Sub(migrations, "migrations/"+set)
	if err != nil {
		return fmt.Errorf("migrate: set %s: %w", set, err)
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(schema + "/" + set))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(int64(h.Sum64() >> 1)))
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub,
		goose.WithTableName("goose_"+set),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		return fmt.Errorf("migrate: set %s: %w", set, err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate: schema %s set %s: %w", schema, set, err)
	}
	return nil
}
