package pgroles_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/pgroles"
	"github.com/tripsaga/tripsaga/internal/testenv"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestRolesFollowTheCatalogue(t *testing.T) {
	var names []string
	for _, r := range pgroles.Default() {
		names = append(names, r.Name)
	}
	require.Equal(t, []string{"hotel", "insurance", "payment", "car", "trips", "reconciler", "sim"}, names)
	r, ok := pgroles.ForSchema(pgroles.Default(), "sim_insurer")
	require.True(t, ok)
	require.Equal(t, "sim", r.Name)
	// A service a catalogue adds gets its role, owning its schema.
	cat := events.Default
	cat.Projections = append(cat.Projections, events.Projection{Name: "audit", Service: "audit"})
	r, ok = pgroles.ForProcess(pgroles.Roles(cat), "audit")
	require.True(t, ok)
	require.Equal(t, []string{"audit"}, r.Schemas)
}

// denied asserts that err is PostgreSQL's permission denied (42501).
func denied(t *testing.T, err error, what string) {
	t.Helper()
	var pe *pgconn.PgError
	require.Truef(t, errors.As(err, &pe), "%s: want permission denied, got %v", what, err)
	require.Equalf(t, "42501", pe.Code, "%s: %v", what, err)
}

// TestHotelRoleCannotTouchPayment: the hotel role, connected with its own
// URL, cannot read or write the payment service's tables, create objects
// in another schema, in public or a schema of its own; it can use its own
// schema, where its migrations ran as itself.
func TestHotelRoleCannotTouchPayment(t *testing.T) {
	ctx := context.Background()
	admin := testenv.Postgres(t)
	urls := testenv.Roles(t, admin)
	require.NoError(t, tripsql.Migrate(ctx, urls["hotel"], "hotel", tripsql.SetSaga))
	require.NoError(t, tripsql.Migrate(ctx, urls["payment"], "payment", tripsql.SetSaga))

	hotel, err := pgx.Connect(ctx, urls["hotel"])
	require.NoError(t, err)
	defer hotel.Close(ctx)
	var who string
	require.NoError(t, hotel.QueryRow(ctx, "SELECT current_user").Scan(&who))
	require.Equal(t, "hotel", who)

	// Its own schema: owned, migrated as itself.
	var owner string
	require.NoError(t, hotel.QueryRow(ctx, "SELECT tableowner FROM pg_tables WHERE schemaname = 'hotel' AND tablename = 'outbox'").Scan(&owner))
	require.Equal(t, "hotel", owner)
	_, err = hotel.Exec(ctx, "SELECT count(*) FROM hotel.outbox")
	require.NoError(t, err)

	for _, q := range []string{
		"SELECT count(*) FROM payment.outbox",
		"SELECT count(*) FROM payment.steps",
		"INSERT INTO payment.incidents DEFAULT VALUES",
		"UPDATE payment.steps SET status = 'done'",
		"DELETE FROM payment.outbox",
		"CREATE TABLE payment.forged (x int)",
		"CREATE TABLE public.forged (x int)",
		"CREATE SCHEMA forged",
		"CREATE TEMP TABLE forged (x int)",
		"ALTER TABLE payment.outbox ADD COLUMN forged int",
		"GRANT USAGE ON SCHEMA payment TO hotel",
	} {
		_, err := hotel.Exec(ctx, q)
		denied(t, err, q)
	}
	// Nor can it log in as another role without its password.
	wrong, err := pgroles.RoleURL(admin, "payment", "not-the-password")
	require.NoError(t, err)
	if _, err := pgx.Connect(ctx, wrong); err == nil {
		t.Fatal("payment's role accepted a wrong password")
	} else {
		require.NotContains(t, err.Error(), "not-the-password")
	}
}

// TestBootstrapAdoptsSchemasOfAnEarlierVersion: a schema made by the
// administrator (as every version before the roles did), with its tables
// and sequences, is handed over to its role with its rows.
func TestBootstrapAdoptsSchemasOfAnEarlierVersion(t *testing.T) {
	ctx := context.Background()
	admin := testenv.Postgres(t)
	require.NoError(t, tripsql.Migrate(ctx, admin, "car", tripsql.SetSaga))
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE TABLE car.extra (id bigserial PRIMARY KEY, v text);
		CREATE SEQUENCE car.loose; CREATE VIEW car.v AS SELECT 1 AS one;
		CREATE TYPE car.mood AS ENUM ('ok'); CREATE FUNCTION car.f() RETURNS int LANGUAGE sql AS 'SELECT 1';
		INSERT INTO car.extra (v) VALUES ('kept')`)
	require.NoError(t, err)

	urls := testenv.Roles(t, admin)
	var left []string
	rows, err := conn.Query(ctx, `
SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'car'::regnamespace AND c.relowner <> 'car'::regrole
UNION ALL SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'car'::regnamespace AND p.proowner <> 'car'::regrole
UNION ALL SELECT t.typname FROM pg_type t WHERE t.typnamespace = 'car'::regnamespace AND t.typowner <> 'car'::regrole
UNION ALL SELECT n.nspname FROM pg_namespace n WHERE n.nspname = 'car' AND n.nspowner <> 'car'::regrole`)
	require.NoError(t, err)
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		left = append(left, n)
	}
	require.NoError(t, rows.Err())
	require.Empty(t, left, "objects of schema car not handed to role car")

	car, err := pgx.Connect(ctx, urls["car"])
	require.NoError(t, err)
	defer car.Close(ctx)
	_, err = car.Exec(ctx, "INSERT INTO car.extra (v) VALUES ('new')")
	require.NoError(t, err)
	var n int
	require.NoError(t, car.QueryRow(ctx, "SELECT count(*) FROM car.extra").Scan(&n))
	require.Equal(t, 2, n)
	// Migrations as the role find the schema up to date.
	require.NoError(t, tripsql.Migrate(ctx, urls["car"], "car", tripsql.SetSaga))

	// A tool run with the administrator's URL migrates a role's schema as
	// its owner: the new tables are the role's, not the administrator's.
	require.NoError(t, tripsql.Migrate(ctx, admin, "trips", tripsql.SetSaga, tripsql.SetTrips))
	var owners []string
	rows, err = conn.Query(ctx, "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'trips'")
	require.NoError(t, err)
	for rows.Next() {
		var o string
		require.NoError(t, rows.Scan(&o))
		owners = append(owners, o)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"trips"}, owners)
}

// TestSecurityTableMatchesBootstrap: SECURITY.md's PostgreSQL table is
// what the server answers after the bootstrap.
func TestSecurityTableMatchesBootstrap(t *testing.T) {
	ctx := context.Background()
	admin := testenv.Postgres(t)
	urls := testenv.Roles(t, admin)
	// The simulators make their own schemas, as themselves.
	require.NoError(t, tripsql.Migrate(ctx, urls["sim"], "sim_hotel", tripsql.SetSim))
	require.NoError(t, tripsql.Migrate(ctx, urls["sim"], "sim_mail", tripsql.SetSim))
	got, err := pgroles.Table(ctx, admin, pgroles.Default())
	require.NoError(t, err)
	doc, err := os.ReadFile("../../SECURITY.md")
	require.NoError(t, err)
	region := between(string(doc), "<!-- postgres:begin", "<!-- postgres:end -->")
	require.Containsf(t, region, got, "SECURITY.md's PostgreSQL table differs from what the bootstrap makes; the table now:\n%s", got)
}

func between(s, begin, end string) string {
	i := strings.Index(s, begin)
	j := strings.Index(s, end)
	if i < 0 || j < i {
		return ""
	}
	return s[i:j]
}
