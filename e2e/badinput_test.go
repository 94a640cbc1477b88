package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBadBytesEveryProcess sends NUL and bytes that are not UTF-8 to
// every endpoint of every running process (issue 7, item 11): each
// answers 400 or 404 application/problem+json, never 500 nor PostgreSQL's
// error text.
func TestBadBytesEveryProcess(t *testing.T) {
	type call struct {
		process, method, path, body string
		key                         string
		code                        int
	}
	nul := strings.Replace(validTrip, "Ada Example", `Ada\u0000Example`, 1)
	calls := []call{
		{"trips", http.MethodPost, "/trips", nul, "", 400},
		{"trips", http.MethodPost, "/trips", strings.Replace(validTrip, "Ada", "Ad\xff", 1), "", 400},
		{"trips", http.MethodPost, "/trips", validTrip, "key-\xff", 400},
		{"trips", http.MethodGet, "/trips/%00", "", "", 404},
		{"trips", http.MethodGet, "/trips/T-%FF", "", "", 404},
		{"trips", http.MethodGet, "/trips?after=T-%FF", "", "", 400},
		{"trips", http.MethodGet, "/trips?status=%00", "", "", 400},
		{"reconciler", http.MethodGet, "/view/%00", "", "", 404},
		{"reconciler", http.MethodGet, "/view/T-%FF", "", "", 404},
		{"reconciler", http.MethodGet, "/nowhere/%00", "", "", 404},
	}
	for _, p := range []string{"hotel", "payment", "car"} {
		calls = append(calls,
			call{p, http.MethodGet, "/steps/%00", "", "", 404},
			call{p, http.MethodGet, "/steps/T-%FF%FE", "", "", 404},
			call{p, http.MethodGet, "/steps/%00/x", "", "", 404},
		)
	}
	for _, c := range calls {
		t.Run(c.process+" "+c.method+" "+c.path, func(t *testing.T) {
			req, err := http.NewRequest(c.method, sys.URL(c.process)+c.path, strings.NewReader(c.body))
			require.NoError(t, err)
			req.Header.Set("Prefer", "wait=0")
			if c.key != "" {
				req.Header["Idempotency-Key"] = []string{c.key}
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, c.code, resp.StatusCode, string(b))
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), string(b))
			require.NotContains(t, string(b), "SQLSTATE")
		})
	}
	for _, p := range []string{"hotel", "payment", "car"} {
		resp, err := http.Get(sys.URL(p) + "/incidents")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, p)
	}
	// Item 16: the reconciler's page says what its trip counts count.
	resp, err := http.Get(sys.URL("reconciler") + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(b), "trips in the projection now")
}
