package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/saga"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type answer struct {
	code    int
	header  http.Header
	body    string
	problem Problem
}

func get(t *testing.T, method, url string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := answer{code: resp.StatusCode, header: resp.Header, body: string(b)}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		require.NoError(t, json.Unmarshal(b, &a.problem), string(b))
		require.Equal(t, resp.StatusCode, a.problem.Status)
	}
	return a
}

// opsServer serves a step service's operator endpoints on pool as Serve
// does (Guard and Problems around the mux), plus a /healthz.
func opsServer(t *testing.T, pool *pgxpool.Pool, nc *nats.Conn) string {
	t.Helper()
	p := &Process{Name: "hotel", Pool: pool, Mux: http.NewServeMux(), Log: slog.New(slog.DiscardHandler)}
	p.HandleOps()
	p.Mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	hs := httptest.NewServer(Guard(nc, Problems(p.Mux)))
	t.Cleanup(hs.Close)
	return hs.URL
}

// Item 11 of issue 7: a step service's /steps/{trip_id} answers 404
// problem+json for an id that cannot be a trip, never 500; unknown paths
// and methods answer problem+json too.
func TestOpsRefuseBadTripIDs(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.SchemaPool(t, "hotel", tripsql.SetSaga)
	url := opsServer(t, pool, nil)
	for _, path := range []string{"/steps/%00", "/steps/%FF", "/steps/T-%00", "/steps/T-%FF%FE", "/steps/T-a%20b", "/steps/%00/x", "/nowhere/%00"} {
		a := get(t, http.MethodGet, url+path)
		require.Equal(t, http.StatusNotFound, a.code, "%s: %s", path, a.body)
		require.Equal(t, "application/problem+json", a.header.Get("Content-Type"), path)
		require.NotContains(t, a.body, "SQLSTATE", path)
	}
	a := get(t, http.MethodPost, url+"/incidents")
	require.Equal(t, http.StatusMethodNotAllowed, a.code)
	require.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
	require.Contains(t, a.header.Get("Allow"), "GET")

	for _, path := range []string{"/steps/T-1", "/incidents"} {
		a := get(t, http.MethodGet, url+path)
		require.Equal(t, http.StatusOK, a.code, path)
		require.JSONEq(t, `{"items":[]}`, a.body, path)
	}
}

// Item 2 of issue 7 (the API part): PostgreSQL unreachable (nothing
// listens on its port) answers 503 problem+json with Retry-After.
func TestOpsAnswer503WhilePostgreSQLIsDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:"+strconv.Itoa(port)+"/postgres?sslmode=disable&connect_timeout=5")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	url := opsServer(t, pool, nil)
	for _, path := range []string{"/steps/T-1", "/incidents"} {
		a := get(t, http.MethodGet, url+path)
		require.Equal(t, http.StatusServiceUnavailable, a.code, "%s: %s", path, a.body)
		require.Equal(t, strconv.Itoa(RetryAfterSeconds), a.header.Get("Retry-After"), path)
		require.Equal(t, ProblemUnavailable, a.problem.Type, path)
		require.NotContains(t, a.body, "127.0.0.1", "the error's text is not shown")
	}
}

// Item 2 of issue 7 (the API part): NATS down answers 503 on the API,
// while /healthz still answers.
func TestGuardAnswers503WhileNATSIsDown(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.SchemaPool(t, "hotel", tripsql.SetSaga)
	srv, nc, _ := testenv.JetStream(t)
	url := opsServer(t, pool, nc)
	require.Equal(t, http.StatusOK, get(t, http.MethodGet, url+"/incidents").code)
	srv.Shutdown()
	srv.WaitForShutdown()
	testenv.Eventually(t, func() bool { return !nc.IsConnected() }, "client sees NATS gone")
	for _, path := range []string{"/steps/T-1", "/incidents"} {
		a := get(t, http.MethodGet, url+path)
		require.Equal(t, http.StatusServiceUnavailable, a.code, "%s: %s", path, a.body)
		require.Equal(t, strconv.Itoa(RetryAfterSeconds), a.header.Get("Retry-After"), path)
		require.Equal(t, ProblemUnavailable, a.problem.Type, path)
	}
	require.Equal(t, http.StatusOK, get(t, http.MethodGet, url+"/healthz").code, "liveness is not gated")
}

func TestUnavailable(t *testing.T) {
	down := []error{
		&pgconn.PgError{Code: "57P01"}, &pgconn.PgError{Code: "57P03"}, &pgconn.PgError{Code: "08006"}, &pgconn.PgError{Code: "53300"},
		fmt.Errorf("list: %w", &pgconn.PgError{Code: "57P02"}),
		fmt.Errorf("read: %w", io.ErrUnexpectedEOF), fmt.Errorf("dial: %w", syscall.ECONNREFUSED),
		fmt.Errorf("publish: %w", nats.ErrConnectionClosed), nats.ErrNoServers, pgconn.ErrConnClosed,
	}
	for _, err := range down {
		require.True(t, Unavailable(err), "%v", err)
	}
	for _, err := range []error{nil, errors.New("boom"), &pgconn.PgError{Code: "23505"}, &pgconn.PgError{Code: "22021"}, &pgconn.PgError{Code: "42P01"}} {
		require.False(t, Unavailable(err), "%v", err)
	}
}

// WriteError never shows the error's text: it may be PostgreSQL's,
// quoting the input.
func TestWriteErrorHidesTheErrorText(t *testing.T) {
	cases := []struct {
		err  error
		code int
	}{
		{&pgconn.PgError{Code: "22021", Message: `invalid byte sequence for encoding "UTF8": 0xff`}, http.StatusBadRequest},
		{fmt.Errorf("trip: %w", &pgconn.PgError{Code: "42P01", Message: `relation "trips" does not exist`}), http.StatusInternalServerError},
		{fmt.Errorf("conn: %w", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}), http.StatusServiceUnavailable},
	}
	for _, c := range cases {
		w := httptest.NewRecorder()
		WriteError(w, httptest.NewRequest(http.MethodGet, "/trips/T-1", nil), nil, "get trip", c.err)
		require.Equal(t, c.code, w.Code, "%v", c.err)
		require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
		var pgErr *pgconn.PgError
		require.True(t, errors.As(c.err, &pgErr))
		require.NotContains(t, w.Body.String(), pgErr.Message)
		require.NotContains(t, w.Body.String(), pgErr.Code)
	}
}

// TestIncidentsNameTheirOwnerAndEscalation (issue 22 item 7): GET
// /incidents names who owns each incident (INCIDENT_OWNER, or the
// service's name) and, for an open one, when it escalates and whether it
// has by the database's clock; a resolved one has no escalation.
func TestIncidentsNameTheirOwnerAndEscalation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.SchemaPool(t, "hotel", tripsql.SetSaga)
	_, err := pool.Exec(ctx, `INSERT INTO incidents (trip_id, step, kind, attempts, last_error, raised_at, resolved_at) VALUES
		('T-old', 'hotel', 'compensation_stuck', 5, 'release: 503', now() - interval '45 minutes', NULL),
		('T-new', 'hotel', 'compensation_stuck', 5, 'release: 503', now(), NULL),
		('T-done', 'hotel', 'compensation_stuck', 5, 'release: 503', now() - interval '2 hours', now())`)
	require.NoError(t, err)
	list := func(env Env) map[string]saga.Incident {
		t.Helper()
		p := &Process{Name: "hotel", Env: env, Pool: pool, Mux: http.NewServeMux(), Log: slog.New(slog.DiscardHandler)}
		p.HandleOps()
		hs := httptest.NewServer(Problems(p.Mux))
		defer hs.Close()
		a := get(t, http.MethodGet, hs.URL+"/incidents")
		require.Equal(t, http.StatusOK, a.code, a.body)
		var body struct{ Items []saga.Incident }
		require.NoError(t, json.Unmarshal([]byte(a.body), &body))
		out := map[string]saga.Incident{}
		for _, in := range body.Items {
			out[in.TripID] = in
		}
		return out
	}

	got := list(Env{})
	require.Equal(t, "hotel", got["T-old"].Owner, "the service's name when INCIDENT_OWNER is unset")
	require.True(t, got["T-old"].Escalated, "45 minutes open: past the default 30")
	require.WithinDuration(t, got["T-old"].RaisedAt.Add(DefaultIncidentEscalateAfter), *got["T-old"].EscalatesAt, time.Millisecond)
	require.False(t, got["T-new"].Escalated)
	require.Nil(t, got["T-done"].EscalatesAt, "a resolved incident does not escalate")
	require.False(t, got["T-done"].Escalated)

	got = list(Env{IncidentOwner: "hotel-oncall", IncidentEscalateAfter: time.Hour})
	require.Equal(t, "hotel-oncall", got["T-new"].Owner)
	require.False(t, got["T-old"].Escalated, "45 minutes open: not past an hour")
}
