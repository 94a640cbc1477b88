package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/pgroles"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// rolePasswordVar names the postgres container's variable holding role's
// password (deploy/postgres/init-roles.sh).
func rolePasswordVar(role string) string { return "TRIPSAGA_PASSWORD_" + strings.ToUpper(role) }

// TestComposePostgresRoles (issue 9 item 2): compose.yaml's postgres runs
// deploy/postgres/init-roles.sh when its volume is made; the script makes
// the roles of pgroles.Default(), each with a password the container
// holds; and, run with psql against a private cluster, it leaves every role
// with exactly the privileges the bootstrap of `tripsaga up` gives
// (pgroles.Table of both).
func TestComposePostgresRoles(t *testing.T) {
	p := loadCompose(t)
	pg, err := p.GetService("postgres")
	require.NoError(t, err)
	mounted := false
	for _, v := range pg.Volumes {
		if v.Target == "/docker-entrypoint-initdb.d" && strings.HasSuffix(filepath.ToSlash(v.Source), "/deploy/postgres") {
			mounted = true
		}
	}
	require.True(t, mounted, "postgres does not mount deploy/postgres at /docker-entrypoint-initdb.d: %+v", pg.Volumes)
	pgEnv := envOf(pg)

	script := readRepoFile(t, "deploy/postgres/init-roles.sh")
	m := regexp.MustCompile(`(?m)^ROLES="([^"]*)"`).FindStringSubmatch(script)
	require.NotNil(t, m, "init-roles.sh: no ROLES=")
	var want []string
	for _, r := range pgroles.Default() {
		if r.Name != pgroles.SimRole {
			want = append(want, r.Name)
		}
		if pgEnv[rolePasswordVar(r.Name)] == "" {
			t.Errorf("postgres: %s is not set (role %s)", rolePasswordVar(r.Name), r.Name)
		}
	}
	require.Equal(t, want, strings.Fields(m[1]), "init-roles.sh's ROLES differ from pgroles.Default()")

	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql not installed")
	}
	if _, err := pgcluster.FindBinaries(); err != nil {
		t.Skip(err)
	}
	base, err := os.MkdirTemp("", "compose-pg-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	require.NoError(t, os.Chmod(base, 0o711))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(base, "pg")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	dbURL := func(db string) string {
		u, err := url.Parse(c.URL)
		require.NoError(t, err)
		u.Path = "/" + db
		return u.String()
	}
	conn, err := pgx.Connect(ctx, c.URL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE DATABASE tripsaga")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE DATABASE boot")
	require.NoError(t, err)
	conn.Close(ctx)

	cmd := exec.CommandContext(ctx, "bash", filepath.Join("..", "..", "deploy", "postgres", "init-roles.sh"))
	cmd.Env = append(os.Environ(), "POSTGRES_USER=postgres", "POSTGRES_DB=tripsaga",
		"PGHOST=127.0.0.1", "PGPORT="+strconv.Itoa(c.Port), "PGPASSWORD="+c.Password, "PATH="+filepath.Dir(psql)+":"+os.Getenv("PATH"))
	for k, v := range pgEnv {
		if strings.HasPrefix(k, "TRIPSAGA_PASSWORD_") {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "init-roles.sh:\n%s", out)

	// The simulators make their own schema, as themselves, in both.
	simURL, err := pgroles.RoleURL(dbURL("tripsaga"), pgroles.SimRole, pgEnv[rolePasswordVar(pgroles.SimRole)])
	require.NoError(t, err)
	require.NoError(t, tripsql.Migrate(ctx, simURL, "sim_hotel", tripsql.SetSim))
	fromScript, err := pgroles.Table(ctx, dbURL("tripsaga"), pgroles.Default())
	require.NoError(t, err)

	pw := map[string]string{}
	for _, r := range pgroles.Default() {
		pw[r.Name] = pgEnv[rolePasswordVar(r.Name)]
	}
	urls, err := pgroles.Bootstrap(ctx, dbURL("boot"), pgroles.Default(), pw)
	require.NoError(t, err)
	require.NoError(t, tripsql.Migrate(ctx, urls[pgroles.SimRole], "sim_hotel", tripsql.SetSim))
	fromBootstrap, err := pgroles.Table(ctx, dbURL("boot"), pgroles.Default())
	require.NoError(t, err)
	require.Equal(t, fromBootstrap, fromScript, "init-roles.sh and pgroles.Bootstrap give different privileges")

	// And each compose process's URL logs in as its role.
	for _, r := range pgroles.Default() {
		if slices.Contains([]string{pgroles.SimRole}, r.Name) {
			continue
		}
		u, err := pgroles.RoleURL(dbURL("tripsaga"), r.Name, pgEnv[rolePasswordVar(r.Name)])
		require.NoError(t, err)
		require.NoError(t, tripsql.Migrate(ctx, u, r.Name, tripsql.SetSaga), fmt.Sprintf("role %s migrates its schema", r.Name))
	}
}
