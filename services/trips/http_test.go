package trips

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/process"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// api is the trips API served over HTTP as a process serves it (process.Guard
// and process.Problems around the mux), on real PostgreSQL and NATS. The
// service's relay, projection and mail step do not run: a POST records the
// trip and its event, which is all these tests look at.
type api struct {
	url  string
	pool *pgxpool.Pool
	ns   *server.Server
	nc   *nats.Conn
}

func newAPI(t *testing.T, pool *pgxpool.Pool) *api {
	t.Helper()
	ns, nc, js := testenv.JetStream(t)
	s, err := New(Config{Pool: pool, JetStream: js, MailURL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	mux := http.NewServeMux()
	s.Handler(mux)
	hs := httptest.NewServer(process.Guard(nc, process.Problems(mux)))
	t.Cleanup(hs.Close)
	return &api{url: hs.URL, pool: pool, ns: ns, nc: nc}
}

func schemaPool(t *testing.T) *pgxpool.Pool {
	pool, _ := testenv.SchemaPool(t, "trips", tripsql.SetSaga, tripsql.SetTrips)
	return pool
}

type answer struct {
	code    int
	header  http.Header
	body    string
	problem process.Problem
}

func (a *api) do(t *testing.T, method, path, body string, h map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range h {
		req.Header[k] = []string{v}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	ans := answer{code: resp.StatusCode, header: resp.Header, body: string(b)}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		require.NoError(t, json.Unmarshal(b, &ans.problem), string(b))
		require.Equal(t, resp.StatusCode, ans.problem.Status)
	}
	return ans
}

// day returns the date n days from today (UTC), YYYY-MM-DD.
func day(n int) string { return time.Now().UTC().AddDate(0, 0, n).Format(time.DateOnly) }

// tripJSON is a valid trip request ten days ahead, changed by mod.
func tripJSON(t *testing.T, mod func(m map[string]map[string]any)) string {
	t.Helper()
	m := map[string]map[string]any{
		"traveler": {"name": "Ada Example", "email": "ada@example.com"},
		"hotel":    {"property_id": "P-100", "check_in": day(10), "nights": 2},
		"car":      {"car_class": "compact", "pickup": day(10), "return": day(12)},
		"payment":  {"card_token": "tok_visa_ok", "amount_cents": 33000, "currency": "USD"},
	}
	if mod != nil {
		mod(m)
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return string(b)
}

func (a *api) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, a.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

func errorFields(p process.Problem) map[string]string {
	out := map[string]string{}
	for _, e := range p.Errors {
		out[e.Field] = e.Detail
	}
	return out
}

// Items 7 to 10 and 12 of issue 7: each invalid request is answered 400
// problem+json naming the field (and saying the rule), and nothing is
// recorded or published.
func TestPostRefusesInvalidTrips(t *testing.T) {
	t.Parallel()
	a := newAPI(t, schemaPool(t))
	set := func(section, field string, v any) func(map[string]map[string]any) {
		return func(m map[string]map[string]any) { m[section][field] = v }
	}
	dates := func(in, pickup, ret string) func(map[string]map[string]any) {
		return func(m map[string]map[string]any) {
			m["hotel"]["check_in"], m["car"]["pickup"], m["car"]["return"] = in, pickup, ret
		}
	}
	cases := []struct {
		name   string
		body   string
		key    string
		fields []string
		detail string // part of the first field's detail
	}{
		{"item 7: dates in the past", tripJSON(t, dates("2020-01-01", "2020-01-01", "2020-01-03")), "", []string{"car.pickup", "hotel.check_in"}, "or later"},
		{"item 7: year zero", tripJSON(t, dates("0000-01-01", "0000-01-01", "0000-01-02")), "", []string{"car.pickup", "hotel.check_in"}, "or later"},
		{"item 7: check-in yesterday", tripJSON(t, dates(day(-1), day(0), day(2))), "", []string{"hotel.check_in"}, "or later"},
		{"item 7: beyond the 18-month horizon", tripJSON(t, dates(day(600), day(600), day(602))), "", []string{"hotel.check_in"}, "at most 18 months ahead"},
		{"item 8: car a year after the stay", tripJSON(t, dates(day(10), day(375), day(377))), "", []string{"car.pickup"}, "share at least one day with the stay"},
		{"item 8: return equal to pickup", tripJSON(t, dates(day(10), day(10), day(10))), "", []string{"car.return"}, "at least 1 day after car.pickup"},
		{"item 9: unknown currency", tripJSON(t, set("payment", "currency", "ZZZ")), "", []string{"payment.currency"}, "ISO 4217"},
		{"item 10: 60,000-character name", tripJSON(t, set("traveler", "name", strings.Repeat("n", 60000))), "", []string{"traveler.name"}, "at most 200 characters"},
		{"item 10: 60,000-character property id", tripJSON(t, set("hotel", "property_id", strings.Repeat("P", 60000))), "", []string{"hotel.property_id"}, "at most 64 characters"},
		{"item 10: email a@b", tripJSON(t, set("traveler", "email", "a@b")), "", []string{"traveler.email"}, "domain name"},
		{"item 10: 300-character local part", tripJSON(t, set("traveler", "email", strings.Repeat("a", 300)+"@example.com")), "", []string{"traveler.email"}, "at most 254 octets"},
		{"item 10: CR LF in the name", tripJSON(t, set("traveler", "name", "Ada\r\nBcc: eve@example.com")), "", []string{"traveler.name"}, "control characters or line breaks"},
		{"item 10: line separator in the name", tripJSON(t, set("traveler", "name", "Ada\u2028Example")), "", []string{"traveler.name"}, "control characters or line breaks"},
		{"item 10: C1 control in the car class", tripJSON(t, set("car", "car_class", "compact\u0085")), "", []string{"car.car_class"}, "control characters or line breaks"},
		{"item 12: nights past int64", strings.Replace(tripJSON(t, nil), `"nights":2`, `"nights":99999999999999999999`, 1), "", []string{"hotel.nights"}, "from 1 to 30"},
		{"item 12: key of 256 characters", tripJSON(t, nil), strings.Repeat("é", 256), []string{"Idempotency-Key"}, "at most 255 characters"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := map[string]string{"Prefer": "wait=0"}
			if c.key != "" {
				h["Idempotency-Key"] = c.key
			}
			ans := a.do(t, http.MethodPost, "/trips", c.body, h)
			require.Equal(t, http.StatusBadRequest, ans.code, ans.body)
			require.Equal(t, "application/problem+json", ans.header.Get("Content-Type"))
			got := errorFields(ans.problem)
			require.ElementsMatch(t, c.fields, keys(got), ans.body)
			require.Contains(t, got[c.fields[0]], c.detail)
		})
	}
	require.Zero(t, a.count(t, "trips"), "nothing booked")
	require.Zero(t, a.count(t, "outbox"), "nothing published")

	ans := a.do(t, http.MethodPost, "/trips", tripJSON(t, set("traveler", "name", "Zoë Ω 山田")), map[string]string{"Prefer": "wait=0", "Idempotency-Key": strings.Repeat("é", 255)})
	require.Equal(t, http.StatusAccepted, ans.code, "a valid trip with a 255-character key is taken: %s", ans.body)
	require.Equal(t, 1, a.count(t, "trips"))
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Item 11: NUL and bytes that are not UTF-8, in the body, the
// Idempotency-Key, path ids and list cursors, are answered 400 or 404
// problem+json, never 500, and PostgreSQL never sees them.
func TestBadBytesAreRefusedNever500(t *testing.T) {
	t.Parallel()
	a := newAPI(t, schemaPool(t))
	type call struct {
		name, method, path, body string
		h                        map[string]string
		code                     int
	}
	calls := []call{
		{"body not UTF-8", http.MethodPost, "/trips", strings.Replace(tripJSON(t, nil), "Ada", "Ad\xff", 1), nil, 400},
		{"Idempotency-Key not UTF-8", http.MethodPost, "/trips", tripJSON(t, nil), map[string]string{"Idempotency-Key": "k-\xff\xfe"}, 400},
		{"GET /trips/%00", http.MethodGet, "/trips/%00", "", nil, 404},
		{"GET /trips/%FF", http.MethodGet, "/trips/%FF", "", nil, 404},
		{"GET /trips/T-%00", http.MethodGet, "/trips/T-%00", "", nil, 404},
		{"GET /trips/T-%C3%A9", http.MethodGet, "/trips/T-%C3%A9", "", nil, 404},
		{"GET /trips/%00/x", http.MethodGet, "/trips/%00/x", "", nil, 404},
		{"cursor T-%FF", http.MethodGet, "/trips?after=T-%FF", "", nil, 400},
		{"cursor %00", http.MethodGet, "/trips?after=%00", "", nil, 400},
		{"status %00", http.MethodGet, "/trips?status=%00", "", nil, 400},
		{"status %FF", http.MethodGet, "/trips?status=%FF", "", nil, 400},
		{"limit %00", http.MethodGet, "/trips?limit=%00", "", nil, 400},
		{"DELETE /trips", http.MethodDelete, "/trips", "", nil, 405},
	}
	for _, section := range []string{"traveler.name", "traveler.email", "hotel.property_id", "hotel.check_in", "car.car_class", "car.pickup", "car.return", "payment.card_token", "payment.currency"} {
		s, f, _ := strings.Cut(section, ".")
		body := tripJSON(t, func(m map[string]map[string]any) { m[s][f] = fmt.Sprint(m[s][f]) + "\x00" })
		calls = append(calls, call{"NUL in " + section, http.MethodPost, "/trips", body, nil, 400})
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			h := map[string]string{"Prefer": "wait=0"}
			for k, v := range c.h {
				h[k] = v
			}
			ans := a.do(t, c.method, c.path, c.body, h)
			require.Equal(t, c.code, ans.code, ans.body)
			require.Equal(t, "application/problem+json", ans.header.Get("Content-Type"), ans.body)
			require.NotContains(t, ans.body, "SQLSTATE")
		})
	}
	require.Zero(t, a.count(t, "trips"), "nothing booked")
}

// A NUL in a header never reaches the handler: net/http refuses the
// request itself, with 400.
func TestNULInAHeaderIsRefusedByTheServer(t *testing.T) {
	t.Parallel()
	a := newAPI(t, schemaPool(t))
	conn, err := net.Dial("tcp", strings.TrimPrefix(a.url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	body := tripJSON(t, nil)
	_, err = fmt.Fprintf(conn, "POST /trips HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\x00\r\nPrefer: wait=0\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Zero(t, a.count(t, "trips"))
}

// requireUnavailable checks one answer is 503 problem+json with Retry-After.
func requireUnavailable(t *testing.T, ans answer, what string) {
	t.Helper()
	require.Equal(t, http.StatusServiceUnavailable, ans.code, "%s: %s", what, ans.body)
	require.Equal(t, "application/problem+json", ans.header.Get("Content-Type"), what)
	require.Equal(t, strconv.Itoa(process.RetryAfterSeconds), ans.header.Get("Retry-After"), what)
	require.Equal(t, process.ProblemUnavailable, ans.problem.Type, what)
}

// every API call of the trips service, on a trip recorded before.
func (a *api) everyEndpoint(t *testing.T, trip string) map[string]answer {
	t.Helper()
	return map[string]answer{
		"POST /trips":      a.do(t, http.MethodPost, "/trips", tripJSON(t, nil), map[string]string{"Prefer": "wait=0"}),
		"POST /trips key":  a.do(t, http.MethodPost, "/trips", tripJSON(t, nil), map[string]string{"Prefer": "wait=0", "Idempotency-Key": "k-down"}),
		"GET /trips/{id}":  a.do(t, http.MethodGet, "/trips/"+trip, "", nil),
		"GET /trips":       a.do(t, http.MethodGet, "/trips", "", nil),
		"GET /trips?after": a.do(t, http.MethodGet, "/trips?status=pending&limit=1&after="+trip, "", nil),
	}
}

// Item 2 (the API part): PostgreSQL killed with SIGKILL under the API:
// every endpoint answers 503 problem+json with Retry-After, never 500, and
// answers again once PostgreSQL is back.
func TestAPIAnswers503WhilePostgreSQLIsDown(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "tripsaga-trips-pg-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755)) // the postgres OS user, when run as root
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(dir, "pg")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	require.NoError(t, tripsql.Migrate(ctx, c.URL, "trips", tripsql.SetSaga, tripsql.SetTrips))
	cfg, err := pgxpool.ParseConfig(c.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = "trips"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	a := newAPI(t, pool)

	ans := a.do(t, http.MethodPost, "/trips", tripJSON(t, nil), map[string]string{"Prefer": "wait=0"})
	require.Equal(t, http.StatusAccepted, ans.code, ans.body)
	var trip Trip
	require.NoError(t, json.Unmarshal([]byte(ans.body), &trip))
	for what, ans := range a.everyEndpoint(t, trip.TripID) {
		require.Contains(t, []int{200, 202}, ans.code, "%s before the kill: %s", what, ans.body)
	}

	// The test cluster commits asynchronously (synchronous_commit off): a
	// CHECKPOINT writes the trip out, or the kill may lose it.
	_, err = pool.Exec(ctx, "CHECKPOINT")
	require.NoError(t, err)
	pid := postmasterPID(t, c.DataDir)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	testenv.Eventually(t, func() bool { return syscall.Kill(pid, 0) != nil }, "postmaster %d gone", pid)
	// Backends notice their postmaster's death on their own; until then a
	// read may still be answered. Wait for the first 503, never seeing 500.
	testenv.Eventually(t, func() bool {
		ans := a.do(t, http.MethodGet, "/trips/"+trip.TripID, "", nil)
		require.Contains(t, []int{200, 503}, ans.code, ans.body)
		return ans.code == http.StatusServiceUnavailable
	}, "GET answers 503 once PostgreSQL is gone")
	for what, ans := range a.everyEndpoint(t, trip.TripID) {
		requireUnavailable(t, ans, what)
	}
	ans = a.do(t, http.MethodPost, "/trips", tripJSON(t, func(m map[string]map[string]any) { m["payment"]["currency"] = "ZZZ" }), nil)
	require.Equal(t, http.StatusBadRequest, ans.code, "an invalid request is still told what is wrong")

	c2, err := pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(dir, "pg"), Port: c.Port})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c2.Stop() })
	testenv.Eventually(t, func() bool {
		return a.do(t, http.MethodGet, "/trips/"+trip.TripID, "", nil).code == http.StatusOK
	}, "GET answers 200 once PostgreSQL is back")
}

func postmasterPID(t *testing.T, dataDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	require.NoError(t, err)
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	return pid
}

// Item 2 (the API part): NATS down: every endpoint answers 503
// problem+json with Retry-After, and nothing is booked meanwhile.
func TestAPIAnswers503WhileNATSIsDown(t *testing.T) {
	t.Parallel()
	a := newAPI(t, schemaPool(t))
	ans := a.do(t, http.MethodPost, "/trips", tripJSON(t, nil), map[string]string{"Prefer": "wait=0"})
	require.Equal(t, http.StatusAccepted, ans.code, ans.body)
	var trip Trip
	require.NoError(t, json.Unmarshal([]byte(ans.body), &trip))

	a.ns.Shutdown()
	a.ns.WaitForShutdown()
	testenv.Eventually(t, func() bool { return !a.nc.IsConnected() }, "client sees NATS gone")
	for what, ans := range a.everyEndpoint(t, trip.TripID) {
		requireUnavailable(t, ans, what)
	}
	require.Equal(t, 1, a.count(t, "trips"), "nothing booked while NATS is down")
}

// Item 10: nothing a traveler (or a company's reason) sends starts a new
// line in the mail sent to the relay, even for a trip recorded before the
// API refused such names.
func TestMailTextKeepsEveryFieldOnItsLine(t *testing.T) {
	t.Parallel()
	pool := schemaPool(t)
	_, _, js := testenv.JetStream(t)
	s, err := New(Config{Pool: pool, JetStream: js, MailURL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	ctx := context.Background()
	for _, status := range []string{StatusConfirmed, StatusCanceled} {
		typ := map[string]string{StatusConfirmed: events.TripConfirmed, StatusCanceled: events.TripCanceled}[status]
		trip := "T-mail-" + status
		e, err := events.New(events.Source("trips"), typ, trip, events.TripSettledData{
			TripID: trip, Status: status, Reason: "sold\r\nout\u2028",
			Traveler: events.Person{Name: "Ada\r\nBcc: eve@example.com\n\nP.S.\x00\u0085", Email: "ada@example.com"},
		})
		require.NoError(t, err)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, s.requestMail(ctx, tx, e))
		require.NoError(t, tx.Commit(ctx))

		var body map[string]string
		require.NoError(t, pool.QueryRow(ctx, "SELECT request FROM steps WHERE idempotency_key = $1", trip+":mail:"+status).Scan(&body))
		require.Equal(t, 3, strings.Count(body["text"], "\n"), "only the template's own line breaks: %q", body["text"])
		require.True(t, strings.HasPrefix(body["text"], "Hello Ada  Bcc: eve@example.com  P.S.  ,\n\n"), "%q", body["text"])
		_, _, bad := events.FindControl(body["subject"])
		require.False(t, bad, body["subject"])
		for _, line := range strings.Split(body["text"], "\n") {
			_, _, bad := events.FindControl(line)
			require.False(t, bad, "%q", line)
		}
	}
}

// TestRoughEdgesOfTheAPI (issue 19 item 7): a second Idempotency-Key
// header was ignored (the first one taken), and a cancellation body of
// "{ }" was refused while "{}\n" was taken. Two keys are refused, naming
// the header, and nothing is recorded; an empty JSON object is an empty
// cancellation body however it is spaced, a member or another value is
// not.
func TestRoughEdgesOfTheAPI(t *testing.T) {
	t.Parallel()
	a := newAPI(t, schemaPool(t))
	req, err := http.NewRequest(http.MethodPost, a.url+"/trips", strings.NewReader(tripJSON(t, nil)))
	require.NoError(t, err)
	req.Header["Idempotency-Key"] = []string{"k-1", "k-2"}
	req.Header.Set("Prefer", "wait=0")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var p process.Problem
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, errorFields(p)["Idempotency-Key"], "given 2 times")
	require.Zero(t, a.count(t, "trips"), "nothing booked")

	unknown := "T-01KF0FV2E00W3GE1R70W3GE1R7" // a trip id no trip has
	for body, want := range map[string]int{
		"":          http.StatusNotFound, // taken: then the trip is looked up
		"{}":        http.StatusNotFound,
		"{ }":       http.StatusNotFound,
		"{\n}\n":    http.StatusNotFound,
		`{"fee":0}`: http.StatusBadRequest,
		"[]":        http.StatusBadRequest,
		"{}{}":      http.StatusBadRequest,
	} {
		ans := a.do(t, http.MethodPost, "/trips/"+unknown+"/cancellation", body, map[string]string{"Idempotency-Key": "c-1"})
		require.Equal(t, want, ans.code, "body %q: %s", body, ans.body)
		if want == http.StatusBadRequest {
			require.Contains(t, errorFields(ans.problem), "body", "body %q", body)
		}
	}
}
