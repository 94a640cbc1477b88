package providertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// suite checks one company.
type suite struct {
	c      company
	f      Features
	client *http.Client
}

func newSuite(t *testing.T, c company, f Features) *suite {
	t.Helper()
	require.NotEmpty(t, c.base, "base URL")
	client := f.HTTPClient
	if client == nil {
		client = &http.Client{}
	}
	if f.RequestTimeout <= 0 {
		f.RequestTimeout = RequestTimeoutDefault
	}
	return &suite{c: c, f: f, client: client}
}

// newTrip returns a trip id no other test uses: "T-ct" and 12 random hex
// digits.
func newTrip() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "T-ct" + hex.EncodeToString(b[:])
}

// key returns the Idempotency-Key of this company's step of trip, with an
// optional suffix for a trip with several records ("T-…:hotel:2").
func (s *suite) key(trip string, suffix ...string) string {
	k := trip + ":" + s.c.step
	for _, x := range suffix {
		k += ":" + x
	}
	return k
}

// answer is one HTTP answer, its JSON object decoded with numbers kept as
// json.Number (so an integer can be told from 12345.0).
type answer struct {
	code   int
	header http.Header
	raw    string
	body   map[string]any
}

// do sends one request and requires an answer with a JSON object body.
// key "" sends no Idempotency-Key; body nil sends no body.
func (s *suite) do(t *testing.T, method, path, key string, body any) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(t.Context(), s.f.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.c.base+path, rd)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := s.client.Do(req)
	require.NoError(t, err, "%s %s", method, path)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err, "%s %s: read answer", method, path)
	a := answer{code: resp.StatusCode, header: resp.Header, raw: string(b)}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&a.body), "%s %s: answer %d is not a JSON object: %q", method, path, a.code, a.raw)
	require.NotNil(t, a.body, "%s %s: answer %d is not a JSON object: %q", method, path, a.code, a.raw)
	return a
}

func (s *suite) collectionPath() string { return "/" + s.c.collection }

func (s *suite) keyPath(key string) string {
	return "/" + s.c.collection + "/" + url.PathEscape(key)
}

// create posts a create under key.
func (s *suite) create(t *testing.T, key string, body map[string]any) answer {
	t.Helper()
	return s.do(t, http.MethodPost, s.collectionPath(), key, body)
}

// mustCreate posts a create under key and requires it done.
func (s *suite) mustCreate(t *testing.T, key string, body map[string]any) answer {
	t.Helper()
	a := s.create(t, key, body)
	require.Equal(t, s.c.createCode, a.code, "create %s: %s", key, a.raw)
	return a
}

func (s *suite) get(t *testing.T, key string) answer {
	t.Helper()
	return s.do(t, http.MethodGet, s.keyPath(key), "", nil)
}

func (s *suite) undo(t *testing.T, key string) answer {
	t.Helper()
	return s.do(t, http.MethodPost, s.keyPath(key)+"/"+s.c.undoVerb, "", nil)
}

// listed is one list item with the cursor that fetched its page ("" for
// the first page).
type listed struct {
	item  map[string]any
	after string
}

// page is one list page as the suite saw it.
type page struct {
	after   string // cursor that fetched it
	n       int    // items on it
	hasNext bool
}

// walk pages through GET /<collection>?status=&limit=&after= from cursor
// after ("" = the start) to the last page, requiring each page well formed:
// 200, items an array of objects with a key, at most limit items, next a
// non-empty string when present and never the cursor just used.
func (s *suite) walk(t *testing.T, status string, limit int, after string) ([]listed, []page) {
	t.Helper()
	var (
		items []listed
		pages []page
	)
	for range 1_000_000 {
		q := url.Values{}
		if status != "" {
			q.Set("status", status)
		}
		q.Set("limit", strconv.Itoa(limit))
		if after != "" {
			q.Set("after", after)
		}
		a := s.do(t, http.MethodGet, s.collectionPath()+"?"+q.Encode(), "", nil)
		require.Equal(t, http.StatusOK, a.code, "list %s: %s", q.Encode(), a.raw)
		raw, ok := a.body["items"].([]any)
		require.True(t, ok, "list %s: items must be an array: %s", q.Encode(), a.raw)
		require.LessOrEqual(t, len(raw), limit, "list %s: more items than limit", q.Encode())
		for _, it := range raw {
			m, ok := it.(map[string]any)
			require.True(t, ok, "list %s: item must be an object: %v", q.Encode(), it)
			require.NotEmpty(t, m["key"], "list %s: item without key: %v", q.Encode(), m)
			items = append(items, listed{item: m, after: after})
		}
		p := page{after: after, n: len(raw)}
		next, present := a.body["next"]
		if !present || next == nil {
			pages = append(pages, p)
			return items, pages
		}
		cursor, ok := next.(string)
		require.True(t, ok && cursor != "", "list %s: next must be a non-empty string cursor: %v", q.Encode(), next)
		require.NotEqual(t, after, cursor, "list %s: next repeats the cursor just used", q.Encode())
		p.hasNext = true
		pages = append(pages, p)
		after = cursor
	}
	require.FailNow(t, "list never ended")
	return nil, nil
}

// ofTrip returns, in list order, the items of trip.
func ofTrip(items []listed, trip string) []map[string]any {
	var out []map[string]any
	for _, it := range items {
		if it.item["trip_id"] == trip {
			out = append(out, it.item)
		}
	}
	return out
}

// keysOf returns the key of each item.
func keysOf(items []map[string]any) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		k, _ := it["key"].(string)
		out = append(out, k)
	}
	return out
}

// recordsOfTrip returns the company's records of trip, oldest first. The
// mail relay is asked with ?trip_id=; the others are paged through whole,
// as the contract promises them no trip filter.
func (s *suite) recordsOfTrip(t *testing.T, trip string) []map[string]any {
	t.Helper()
	if s.c.undoVerb == "" {
		a := s.do(t, http.MethodGet, s.collectionPath()+"?"+url.Values{"trip_id": {trip}}.Encode(), "", nil)
		require.Equal(t, http.StatusOK, a.code, "list messages of %s: %s", trip, a.raw)
		raw, ok := a.body["items"].([]any)
		require.True(t, ok, "list messages of %s: items must be an array: %s", trip, a.raw)
		out := make([]map[string]any, 0, len(raw))
		for _, it := range raw {
			m, ok := it.(map[string]any)
			require.True(t, ok, "list messages of %s: item must be an object: %v", trip, it)
			out = append(out, m)
		}
		return out
	}
	items, _ := s.walk(t, "", 1000, "")
	return ofTrip(items, trip)
}

// statementOfTrip returns the statement lines of trip on token.
func (s *suite) statementOfTrip(t *testing.T, token, trip string) []map[string]any {
	t.Helper()
	a := s.do(t, http.MethodGet, "/statements/"+url.PathEscape(token), "", nil)
	require.Equal(t, http.StatusOK, a.code, "statement %s: %s", token, a.raw)
	raw, ok := a.body["lines"].([]any)
	require.True(t, ok, "statement %s: lines must be an array: %s", token, a.raw)
	var out []map[string]any
	for _, l := range raw {
		m, ok := l.(map[string]any)
		require.True(t, ok, "statement %s: line must be an object: %v", token, l)
		if m["trip_id"] == trip {
			out = append(out, m)
		}
	}
	return out
}

// addRule adds a fault rule with POST <base>/_faults ([Features.Faults]).
func (s *suite) addRule(t *testing.T, rule map[string]any) {
	t.Helper()
	a := s.do(t, http.MethodPost, "/_faults", "", rule)
	require.Equal(t, http.StatusCreated, a.code, "add fault rule %v: %s", rule, a.raw)
}

// requireInteger requires v to be a JSON integer equal to want.
func requireInteger(t *testing.T, want int64, v any, msgAndArgs ...any) {
	t.Helper()
	n, ok := v.(json.Number)
	require.True(t, ok, "want a JSON number, got %T %v", v, v)
	got, err := strconv.ParseInt(n.String(), 10, 64)
	require.NoError(t, err, "want an integer in minor units, got %s", n)
	require.Equal(t, want, got, msgAndArgs...)
}
