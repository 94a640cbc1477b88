package trips

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/process"
)

// GET /ops/trips finds a trip by the Idempotency-Key of its POST, and the
// newest trips of a traveler's email without case; no q is a 400 naming
// the field.
func TestLookup(t *testing.T) {
	t.Parallel()
	pool := schemaPool(t)
	_, nc, js := testenv.JetStream(t)
	s, err := New(Config{Pool: pool, JetStream: js, MailURL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	mux := http.NewServeMux()
	s.Handler(mux)
	s.HandleLookup(mux)
	hs := httptest.NewServer(process.Guard(nc, process.Problems(mux)))
	t.Cleanup(hs.Close)
	a := &api{url: hs.URL, pool: pool}

	var ids []string
	for i, email := range []string{"ada@example.com", "Ada@Example.COM", "grace@example.com"} {
		body := tripJSON(t, func(m map[string]map[string]any) { m["traveler"]["email"] = email })
		ans := a.do(t, http.MethodPost, "/trips", body, map[string]string{"Prefer": "wait=0", "Idempotency-Key": "lookup-" + string(rune('a'+i))})
		require.Equal(t, http.StatusAccepted, ans.code, ans.body)
		var tr Trip
		require.NoError(t, json.Unmarshal([]byte(ans.body), &tr))
		ids = append(ids, tr.TripID)
	}
	find := func(q string) []LookupHit {
		ans := a.do(t, http.MethodGet, "/ops/trips?q="+q, "", nil)
		require.Equal(t, http.StatusOK, ans.code, ans.body)
		var out struct {
			Items []LookupHit `json:"items"`
		}
		require.NoError(t, json.Unmarshal([]byte(ans.body), &out))
		return out.Items
	}
	require.Equal(t, []LookupHit{{ids[1], "idempotency_key"}}, find("lookup-b"))
	require.Equal(t, []LookupHit{{ids[1], "email"}, {ids[0], "email"}}, find("ADA@example.com"), "newest first, without case")
	require.Empty(t, find("nobody@example.com"))
	require.Empty(t, find("lookup-z"))

	ans := a.do(t, http.MethodGet, "/ops/trips", "", nil)
	require.Equal(t, http.StatusBadRequest, ans.code)
	require.Equal(t, "q", ans.problem.Errors[0].Field)
}
