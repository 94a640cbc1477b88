// Package pgroles gives every process of the system its own PostgreSQL
// login role: the role owns its schemas (and every object in them), and
// has no privilege on any other schema, nor may it create a schema, a
// temporary table or an object in the public schema. A service's migrations
// run as its role (sql.Migrate through the DATABASE_URL it is given), so a
// bug or a leaked password of one service cannot read or rewrite another
// service's step log or outbox.
//
// The bootstrap ([Bootstrap]) runs with an administrator's URL (a
// superuser, or a role with CREATEROLE that may hand schemas over): `tripsaga
// up`, the tests (internal/testenv), bench and chaos call it; compose.yaml
// runs deploy/postgres/init-roles.sh, which makes the same roles.
package pgroles

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tripsaga/tripsaga/events"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// Role is one login role and the schemas it owns.
type Role struct {
	Name string
	// Schemas are made by the bootstrap, owned by the role.
	Schemas []string
	// SchemaPrefix, when set, lets the role make its own schemas (CREATE
	// on the database), named with this prefix by convention; an existing
	// schema with the prefix is handed to it by the bootstrap. Only the
	// simulators, which stand for companies we do not own and add one
	// schema per company, have one.
	SchemaPrefix string
}

// SimRole is the role of the company simulators (`tripsaga serve sim`),
// owner of the schemas [tripsql.SimSchemaPrefix]* (one per company).
const SimRole = "sim"

// Roles returns one role per service of cat (cat.Services(): its steps'
// then its projections' services), each owning the schema of
// its name (a service's schema is its name: process.RunStep, trips,
// reconciler), then [SimRole] with the simulators' schemas. A service a
// catalogue adds gets its role from here, with nothing else to change.
func Roles(cat events.Catalogue) []Role {
	names := cat.Services()
	roles := make([]Role, 0, len(names)+1)
	for _, n := range names {
		roles = append(roles, Role{Name: n, Schemas: []string{n}})
	}
	return append(roles, Role{Name: SimRole, SchemaPrefix: tripsql.SimSchemaPrefix})
}

// Default is Roles(events.Full()): every service any STEPS configuration
// may run (the optional insurance step too), so the roles do not change
// with the configuration.
func Default() []Role { return Roles(events.Full()) }

// ForSchema returns the role of roles that owns schema.
func ForSchema(roles []Role, schema string) (Role, bool) {
	for _, r := range roles {
		if slices.Contains(r.Schemas, schema) || (r.SchemaPrefix != "" && strings.HasPrefix(schema, r.SchemaPrefix)) {
			return r, true
		}
	}
	return Role{}, false
}

// ForProcess returns the role a process of `tripsaga serve <process>`
// connects as: the role of its name ("hotel", "sim").
func ForProcess(roles []Role, process string) (Role, bool) {
	for _, r := range roles {
		if r.Name == process {
			return r, true
		}
	}
	return Role{}, false
}

// NewPassword returns a random password: 32 hex digits (128 bits).
func NewPassword() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// Passwords returns a new password ([NewPassword]) for each role.
func Passwords(roles []Role) map[string]string {
	pw := make(map[string]string, len(roles))
	for _, r := range roles {
		pw[r.Name] = NewPassword()
	}
	return pw
}

// RoleURL returns adminURL (a postgres:// or postgresql:// URL) with its
// user and password replaced by role's. Every other part (host, database,
// sslmode, sslrootcert...) is kept. A keyword/value connection string is an
// error: role URLs are derived from URLs only.
func RoleURL(adminURL, role, password string) (string, error) {
	u, err := url.Parse(adminURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", errors.New("pgroles: the administrator's DATABASE_URL must be a postgres:// URL to derive the roles' URLs")
	}
	u.User = url.UserPassword(role, password)
	return u.String(), nil
}

// Bootstrap makes the roles in the cluster adminURL reaches (each a login
// role with the password passwords[role]: created, or its password set
// again) and, in adminURL's database, hands each role its schemas
// ([EnsureSchemas]). It returns each role's URL ([RoleURL]).
func Bootstrap(ctx context.Context, adminURL string, roles []Role, passwords map[string]string) (map[string]string, error) {
	if err := EnsureRoles(ctx, adminURL, roles, passwords); err != nil {
		return nil, err
	}
	if err := EnsureSchemas(ctx, adminURL, roles); err != nil {
		return nil, err
	}
	urls := make(map[string]string, len(roles))
	for _, r := range roles {
		u, err := RoleURL(adminURL, r.Name, passwords[r.Name])
		if err != nil {
			return nil, err
		}
		urls[r.Name] = u
	}
	return urls, nil
}

// EnsureRoles creates each role (LOGIN, and nothing more: no superuser,
// CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS) with its password from
// passwords, or, for a role that exists, takes those attributes away and
// sets its password. Roles are cluster-wide: several processes making the
// same roles at once are retried, not failed. A role without a password in
// passwords is an error.
func EnsureRoles(ctx context.Context, adminURL string, roles []Role, passwords map[string]string) error {
	conn, err := connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, r := range roles {
		pw := passwords[r.Name]
		if pw == "" {
			return fmt.Errorf("pgroles: no password for role %s", r.Name)
		}
		id := pgx.Identifier{r.Name}.Sanitize()
		attrs := " LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT PASSWORD " + quoteLiteral(pw)
		err := retry(ctx, func() error {
			var exists bool
			if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", r.Name).Scan(&exists); err != nil {
				return err
			}
			if exists {
				_, err := conn.Exec(ctx, "ALTER ROLE "+id+" WITH"+attrs)
				return err
			}
			_, err := conn.Exec(ctx, "CREATE ROLE "+id+" WITH"+attrs)
			return err
		})
		if err != nil {
			// The statement holds the password: name the role, not the SQL.
			return fmt.Errorf("pgroles: role %s: %s", r.Name, errText(err))
		}
	}
	return nil
}

// EnsureSchemas, in adminURL's database: takes every privilege away from
// PUBLIC on the database (CONNECT, CREATE, TEMPORARY) and on schema public,
// grants CONNECT to each role (and CREATE to a role with a SchemaPrefix),
// and makes each role the owner of its schemas (and of the existing ones
// with its SchemaPrefix): a missing schema is created owned by it; an existing one (made
// by an earlier version, as the administrator) is handed over with every
// table, view, sequence, function and type in it. No role gets anything
// on a schema it does not own.
func EnsureSchemas(ctx context.Context, adminURL string, roles []Role) error {
	conn, err := connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	db := pgx.Identifier{conn.Config().Database}.Sanitize()
	stmts := []string{
		"REVOKE ALL ON DATABASE " + db + " FROM PUBLIC",
		"REVOKE ALL ON SCHEMA public FROM PUBLIC",
	}
	for _, r := range roles {
		stmts = append(stmts, "GRANT CONNECT ON DATABASE "+db+" TO "+pgx.Identifier{r.Name}.Sanitize())
	}
	for _, s := range stmts {
		if err := retry(ctx, func() error { _, err := conn.Exec(ctx, s); return err }); err != nil {
			return fmt.Errorf("pgroles: %s: %w", s, err)
		}
	}
	for _, r := range roles {
		schemas := slices.Clone(r.Schemas)
		if r.SchemaPrefix != "" {
			s := "GRANT CREATE ON DATABASE " + db + " TO " + pgx.Identifier{r.Name}.Sanitize()
			if err := retry(ctx, func() error { _, err := conn.Exec(ctx, s); return err }); err != nil {
				return fmt.Errorf("pgroles: %s: %w", s, err)
			}
			rows, err := conn.Query(ctx, "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1) ORDER BY nspname", r.SchemaPrefix)
			if err != nil {
				return fmt.Errorf("pgroles: schemas of %s: %w", r.Name, err)
			}
			more, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return fmt.Errorf("pgroles: schemas of %s: %w", r.Name, err)
			}
			schemas = append(schemas, more...)
		}
		for _, schema := range schemas {
			if err := ownSchema(ctx, conn, r.Name, schema); err != nil {
				return fmt.Errorf("pgroles: schema %s for role %s: %w", schema, r.Name, err)
			}
		}
	}
	return nil
}

// ownSchema makes role the owner of schema and of everything in it.
func ownSchema(ctx context.Context, conn *pgx.Conn, role, schema string) error {
	rid, sid := pgx.Identifier{role}.Sanitize(), pgx.Identifier{schema}.Sanitize()
	return retry(ctx, func() error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+sid+" AUTHORIZATION "+rid); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "ALTER SCHEMA "+sid+" OWNER TO "+rid); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "REVOKE ALL ON SCHEMA "+sid+" FROM PUBLIC"); err != nil {
			return err
		}
		// Relations: tables first (ALTER TABLE moves the sequences a
		// column owns along), then views, sequences of their own...
		rows, err := tx.Query(ctx, `
SELECT c.relname, c.relkind::text
FROM pg_class c
WHERE c.relnamespace = $1::regnamespace
  AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
  AND c.relowner <> $2::regrole
  AND NOT EXISTS (SELECT 1 FROM pg_depend d
                  WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                    AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
ORDER BY CASE c.relkind WHEN 'r' THEN 0 WHEN 'p' THEN 0 WHEN 'f' THEN 1 WHEN 'v' THEN 2 WHEN 'm' THEN 2 ELSE 3 END, c.relname`, schema, role)
		if err != nil {
			return err
		}
		type rel struct{ name, kind string }
		var rels []rel
		for rows.Next() {
			var x rel
			if err := rows.Scan(&x.name, &x.kind); err != nil {
				rows.Close()
				return err
			}
			rels = append(rels, x)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		kinds := map[string]string{"r": "TABLE", "p": "TABLE", "f": "FOREIGN TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW", "S": "SEQUENCE"}
		for _, x := range rels {
			if _, err := tx.Exec(ctx, "ALTER "+kinds[x.kind]+" "+pgx.Identifier{schema, x.name}.Sanitize()+" OWNER TO "+rid); err != nil {
				return err
			}
		}
		// Functions and procedures, then enum, domain, range and
		// composite types of their own (a table's row type moves with it).
		if _, err := tx.Exec(ctx, `
DO $do$
DECLARE o record;
BEGIN
  FOR o IN SELECT p.oid::regprocedure AS sig, p.prokind FROM pg_proc p
           WHERE p.pronamespace = `+quoteLiteral(schema)+`::regnamespace AND p.proowner <> `+quoteLiteral(role)+`::regrole LOOP
    IF o.prokind = 'p' THEN
      EXECUTE format('ALTER PROCEDURE %s OWNER TO %I', o.sig, `+quoteLiteral(role)+`);
    ELSIF o.prokind = 'a' THEN
      EXECUTE format('ALTER AGGREGATE %s OWNER TO %I', o.sig, `+quoteLiteral(role)+`);
    ELSE
      EXECUTE format('ALTER FUNCTION %s OWNER TO %I', o.sig, `+quoteLiteral(role)+`);
    END IF;
  END LOOP;
  FOR o IN SELECT t.oid::regtype AS typ FROM pg_type t
           WHERE t.typnamespace = `+quoteLiteral(schema)+`::regnamespace AND t.typowner <> `+quoteLiteral(role)+`::regrole
             AND t.typtype IN ('e', 'd', 'r', 'c') AND (t.typtype <> 'c' OR t.typrelid = 0
               OR (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')
             AND t.typelem = 0 LOOP
    EXECUTE format('ALTER TYPE %s OWNER TO %I', o.typ, `+quoteLiteral(role)+`);
  END LOOP;
END
$do$`); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
}

func connect(ctx context.Context, adminURL string) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		// pgx's errors name the host and user, never the password.
		return nil, fmt.Errorf("pgroles: connect as the administrator: %w", err)
	}
	return conn, nil
}

// retry runs f again, for at most 30 s, while it fails because another
// session changes the same catalogue rows at once (roles are cluster-wide:
// test binaries sharing one cluster make them side by side).
func retry(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		var pe *pgconn.PgError
		if err == nil || !errors.As(err, &pe) || time.Now().After(deadline) {
			return err
		}
		switch pe.Code {
		case "23505", "42710", "40001", "40P01", "XX000": // unique, duplicate object, serialization, deadlock, "tuple concurrently updated"
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// errText is err's message without the statement (which may hold a
// password): the server's message and SQLSTATE.
func errText(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message + " (SQLSTATE " + pe.Code + ")"
	}
	return err.Error()
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Table renders, as a Markdown table, what each role may do in adminURL's
// database as the server itself answers it (pg_namespace owners,
// has_schema_privilege, has_database_privilege): one row per role, one
// column per schema of roles (one for all the schemas of a SchemaPrefix,
// which must exist) plus public, then the database. A cell is
// "owner", the privileges held (USAGE, CREATE) or "-". SECURITY.md holds
// this table; a test compares the two.
func Table(ctx context.Context, adminURL string, roles []Role) (string, error) {
	conn, err := connect(ctx, adminURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	// A column per schema; a role's SchemaPrefix is one column, "prefix*",
	// over every existing schema with it.
	var schemas []string
	for _, r := range roles {
		schemas = append(schemas, r.Schemas...)
		if r.SchemaPrefix != "" {
			schemas = append(schemas, r.SchemaPrefix+"*")
		}
	}
	schemas = append(schemas, "public")
	var b strings.Builder
	b.WriteString("| role |")
	for _, s := range schemas {
		b.WriteString(" `" + s + "` |")
	}
	b.WriteString(" database |\n|---|")
	for range schemas {
		b.WriteString("---|")
	}
	b.WriteString("---|\n")
	for _, r := range roles {
		b.WriteString("| `" + r.Name + "` |")
		for _, s := range schemas {
			cond, arg := "n.nspname = $1", s
			if p, ok := strings.CutSuffix(s, "*"); ok {
				cond, arg = "starts_with(n.nspname, $1)", p
			}
			var n int
			var owner, usage, create bool
			err := conn.QueryRow(ctx, `
SELECT count(*), coalesce(bool_and(n.nspowner = r.oid), false),
       coalesce(bool_or(has_schema_privilege(r.oid, n.oid, 'USAGE')), false), coalesce(bool_or(has_schema_privilege(r.oid, n.oid, 'CREATE')), false)
FROM pg_namespace n, pg_roles r WHERE `+cond+` AND r.rolname = $2`, arg, r.Name).Scan(&n, &owner, &usage, &create)
			if err != nil {
				return "", fmt.Errorf("pgroles: schema %s, role %s: %w", s, r.Name, err)
			}
			if n == 0 {
				return "", fmt.Errorf("pgroles: no schema %s in the database", s)
			}
			var privs []string
			switch {
			case owner:
				privs = []string{"owner"}
			default:
				if usage {
					privs = append(privs, "USAGE")
				}
				if create {
					privs = append(privs, "CREATE")
				}
			}
			if len(privs) == 0 {
				privs = []string{"-"}
			}
			b.WriteString(" " + strings.Join(privs, ", ") + " |")
		}
		var connect, create, temp, super, createRole, createDB bool
		if err := conn.QueryRow(ctx, `
SELECT has_database_privilege(r.oid, current_database(), 'CONNECT'), has_database_privilege(r.oid, current_database(), 'CREATE'),
       has_database_privilege(r.oid, current_database(), 'TEMPORARY'), r.rolsuper, r.rolcreaterole, r.rolcreatedb
FROM pg_roles r WHERE r.rolname = $1`, r.Name).Scan(&connect, &create, &temp, &super, &createRole, &createDB); err != nil {
			return "", fmt.Errorf("pgroles: role %s: %w", r.Name, err)
		}
		var privs []string
		for _, p := range []struct {
			on   bool
			name string
		}{{connect, "CONNECT"}, {create, "CREATE"}, {temp, "TEMPORARY"}, {super, "SUPERUSER"}, {createRole, "CREATEROLE"}, {createDB, "CREATEDB"}} {
			if p.on {
				privs = append(privs, p.name)
			}
		}
		if len(privs) == 0 {
			privs = []string{"-"}
		}
		b.WriteString(" " + strings.Join(privs, ", ") + " |\n")
	}
	return b.String(), nil
}
