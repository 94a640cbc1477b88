package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type testBundle struct {
	sims  *Simulators
	srv   *httptest.Server
	dbURL string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	dbURL := testenv.Postgres(t)
	return setupOn(t, dbURL)
}

// setupOn starts simulators on dbURL behind a fresh httptest server.
func setupOn(t *testing.T, dbURL string) *testBundle {
	t.Helper()
	sims, err := New(context.Background(), Config{
		DatabaseURL: dbURL,
		Logger:      slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	require.NoError(t, err)
	srv := httptest.NewServer(sims.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(sims.Close) // runs first: releases hanging handlers
	return &testBundle{sims: sims, srv: srv, dbURL: dbURL}
}

// company returns the base URL of a company, e.g. http://127.0.0.1:1234/hotel.
func (b *testBundle) company(name string) string { return b.srv.URL + "/" + name }

// client returns an HTTP client that never reuses connections, so that a
// closed connection surfaces as an error: Go's transport silently retries a
// request carrying Idempotency-Key on a reused connection.
func client(timeout time.Duration) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	return &http.Client{Transport: tr, Timeout: timeout}
}

// send makes one call and returns the status and body, or the transport error.
func send(t *testing.T, c *http.Client, method, url, key string, body any) (int, string, error) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		switch v := body.(type) {
		case string:
			rd = bytes.NewReader([]byte(v))
		default:
			b, err := json.Marshal(v)
			require.NoError(t, err)
			rd = bytes.NewReader(b)
		}
	}
	req, err := http.NewRequestWithContext(context.Background(), method, url, rd)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", err
	}
	return resp.StatusCode, string(b), nil
}

// call is send with a patient client that must get an answer.
func call(t *testing.T, method, url, key string, body any) (int, string) {
	t.Helper()
	status, out, err := send(t, client(30*time.Second), method, url, key, body)
	require.NoError(t, err)
	return status, out
}

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &m), "body %q", s)
	return m
}

// items lists a collection (one page) and returns its items and next cursor.
func items(t *testing.T, url string) ([]any, string) {
	t.Helper()
	status, body := call(t, http.MethodGet, url, "", nil)
	require.Equal(t, http.StatusOK, status, body)
	m := decode(t, body)
	next, _ := m["next"].(string)
	list, ok := m["items"].([]any)
	require.True(t, ok, "items in %s", body)
	return list, next
}

func addFault(t *testing.T, base string, r Rule) {
	t.Helper()
	require.NoError(t, AddFault(context.Background(), base, r))
}

func holdBody(trip string) map[string]any {
	return map[string]any{
		"trip_id": trip, "property_id": "P-7", "check_in": "2026-07-01", "nights": 2,
		"guest": map[string]any{"name": "Ada Lovelace", "email": "ada@example.com"},
	}
}

func chargeBody(trip, token string, cents int) map[string]any {
	return map[string]any{"trip_id": trip, "amount_cents": cents, "currency": "EUR", "card_token": token}
}

func bookingBody(trip, email string) map[string]any {
	return map[string]any{
		"trip_id": trip, "car_class": "compact", "pickup": "2026-07-01", "return": "2026-07-03",
		"driver": map[string]any{"name": "Ada Lovelace", "email": email},
	}
}

func messageBody(trip string) map[string]any {
	return map[string]any{"to": "ada@example.com", "subject": "Trip " + trip + " confirmed", "text": "Bon voyage", "trip_id": trip}
}
