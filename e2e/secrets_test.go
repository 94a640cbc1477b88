package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/pgroles"
	"github.com/tripsaga/tripsaga/internal/redact"
	"github.com/tripsaga/tripsaga/internal/stack"
)

func httpBody(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestMaskedInLogsAndViews (issue 9 item 6): a trip booked through the
// running system with its own email and card token, its card statement
// read, and then: no process's log, no /metrics and no reconciler view
// holds the email or the token in full, nor any PostgreSQL password.
func TestMaskedInLogsAndViews(t *testing.T) {
	nonce := fmt.Sprintf("%d", time.Now().UnixNano())
	email := "secret" + nonce + "@example.com"
	token := "tok_visa_" + nonce
	body := strings.Replace(strings.Replace(validTrip, "ada@example.com", email, 1), "tok_visa_ok", token, 1)
	code, out, _ := post(t, body, map[string]string{"Prefer": "wait=10"})
	require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, code)
	id := out["trip_id"].(string)
	wait(t, 90*time.Second, func() bool {
		_, b := httpBody(t, sys.URL("trips")+"/trips/"+id)
		return strings.Contains(b, `"confirmed"`)
	}, "trip %s confirmed", id)
	// The card processor's statement, by token (the simulators' request log).
	code, _ = httpBody(t, sys.CompanyURLs()["PAYMENTS_URL"]+"/statements/"+url.PathEscape(token))
	require.Equal(t, http.StatusOK, code)

	secrets := []string{email, token}
	for _, p := range append(pgroles.Default(), pgroles.Role{Name: "postgres"}) {
		u := sys.RoleURL(p.Name)
		if p.Name == "postgres" {
			u = sys.DatabaseURL
		}
		if pu, err := url.Parse(u); err == nil {
			if pw, ok := pu.User.Password(); ok && pw != "" {
				secrets = append(secrets, pw)
			}
		}
	}
	check := func(where, text string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s holds a secret in full (%s)", where, redact.Token(s))
			}
		}
	}
	// The views: the reconciler's trip view, and its timeline where it
	// has one (the events' data and the company records).
	for _, path := range []string{"/view/" + id, "/api/trips/" + id + "/timeline", "/findings?all=1"} {
		code, b := httpBody(t, sys.URL("reconciler")+path)
		if code == http.StatusNotFound {
			continue
		}
		check("reconciler "+path, b)
		if strings.HasSuffix(path, "/timeline") && code == http.StatusOK {
			require.Contains(t, b, redact.Email(email), "the timeline shows the masked email")
		}
	}
	for _, name := range sys.Instances() {
		_, b := httpBody(t, sys.URL(name)+"/metrics")
		check(name+" /metrics", b)
	}
	// Every log the stack's processes wrote (read after the flows above).
	logs, err := filepath.Glob(filepath.Join(filepath.Dir(sys.LogPath("trips")), "*.log"))
	require.NoError(t, err)
	require.NotEmpty(t, logs)
	for _, f := range logs {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		check(f, string(b))
	}
}

// TestEachProcessIsItsOwnRole (issue 9 item 2, on the running system):
// every service's tables were made by its own role (its migrations ran as
// it), and the hotel process's role is refused on payment's tables.
func TestEachProcessIsItsOwnRole(t *testing.T) {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, sys.DatabaseURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	for _, svc := range stack.Services {
		var owners []string
		rows, err := admin.Query(ctx, "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = $1", svc)
		require.NoError(t, err)
		for rows.Next() {
			var o string
			require.NoError(t, rows.Scan(&o))
			owners = append(owners, o)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []string{svc}, owners, "owners of schema %s's tables", svc)
	}
	hotel, err := pgx.Connect(ctx, sys.RoleURL("hotel"))
	require.NoError(t, err)
	defer hotel.Close(ctx)
	_, err = hotel.Exec(ctx, "SELECT count(*) FROM payment.outbox")
	var pe *pgconn.PgError
	require.True(t, errors.As(err, &pe), "%v", err)
	require.Equal(t, "42501", pe.Code)
}
