package bench

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// A trips API that answers 503, drops the connection, or confirms, in turn.
func flakyTrips(t *testing.T) *httptest.Server {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			_ = json.NewEncoder(w).Encode(map[string]any{"items": []any{}})
			return
		}
		switch n.Add(1) % 3 {
		case 1:
			http.Error(w, "down", http.StatusServiceUnavailable)
		case 2:
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		default:
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(map[string]string{"trip_id": "T-" + r.Header.Get("Idempotency-Key"), "status": "confirmed"})
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestRequestErrorsCountedWithReason: every request without an answer is
// counted under its reason, and the printed report names them in words,
// never in Go's map syntax (issue 7, item 13).
func TestRequestErrorsCountedWithReason(t *testing.T) {
	srv := flakyTrips(t)
	l := newLoader(srv.URL, nil)
	// One connection per request, so that a dropped connection is not
	// retried by the transport.
	l.client.Transport.(*http.Transport).DisableKeepAlives = true
	run := l.closedLoop(context.Background(), 30, 3)
	errs := map[string]int{}
	for _, c := range run.Errors {
		errs[c.Value] = c.N
	}
	if errs["HTTP 503"] != 10 {
		t.Errorf("HTTP 503 counted %d times, want 10 (errors: %v)", errs["HTTP 503"], run.Errors)
	}
	if errs["connection closed without an answer"] != 10 {
		t.Errorf("dropped connections counted %d times, want 10 (errors: %v)", errs["connection closed without an answer"], run.Errors)
	}
	if run.Confirmed != 10 {
		t.Errorf("confirmed %d, want 10", run.Confirmed)
	}
	settle(context.Background(), l, run, nil)
	if run.Settled {
		t.Error("a run with request errors counts as settled")
	}
	rep := &Report{Mode: "external", ClosedLoop: []LoadRun{*run}}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"confirmed 10", "HTTP 503 10", "connection closed without an answer 10"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "map[") {
		t.Errorf("report prints Go map syntax:\n%s", out)
	}
}

func TestCheckURL(t *testing.T) {
	for _, bad := range []string{"127.0.0.1:7405", "localhost:7405", "ftp://x", "http://", "", "://x"} {
		if _, err := CheckURL("--trips-url", bad); err == nil {
			t.Errorf("CheckURL(%q) accepted", bad)
		}
	}
	got, err := CheckURL("--trips-url", "http://127.0.0.1:7405/")
	if err != nil || got != "http://127.0.0.1:7405" {
		t.Errorf("CheckURL: got %q, %v", got, err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Trips: 1, Concurrency: []int{1}, BaselineASeconds: 1, BaselineBSeconds: 1, RelayEvents: 1, RebuildEvents: 5}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"trips -5":      func(c *Config) { c.Trips = -5 },
		"concurrency 0": func(c *Config) { c.Concurrency = []int{0} },
		"no clients":    func(c *Config) { c.Concurrency = nil },
		"open 0 %":      func(c *Config) { c.OpenPercents = []int{0} },
		"relay 0":       func(c *Config) { c.RelayEvents = 0 },
		"bad url":       func(c *Config) { c.TripsURL = "127.0.0.1:7405" },
		"replicas 0":    func(c *Config) { c.Replicas = []int{0} },
		"nats nodes 2":  func(c *Config) { c.Replicas, c.NATSNodes = []int{1}, []int{2} },
		"replicas of a running system": func(c *Config) {
			c.Replicas, c.TripsURL = []int{2}, "http://127.0.0.1:7405"
		},
	} {
		c := ok
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
