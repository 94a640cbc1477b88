package reconciler

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
)

// The dashboard and a trip's page say when the server rendered them and
// carry the script that refreshes them, with its pause; the dashboard no
// longer reloads itself with a meta refresh, which would not wait for an
// operator typing in the search box.
func TestLiveRefresh(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	trip := "T-live"
	b.publish(t, ev(t, events.TripRequested, trip), "")
	mux := http.NewServeMux()
	b.r.Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)

	for _, path := range []string{"/", "/trips/" + trip} {
		code, page := getBody(t, hs.URL+path)
		require.Equal(t, http.StatusOK, code, path)
		require.Regexp(t, `<span id="updated">updated \d\d:\d\d:\d\d UTC</span>`, page, path)
		require.Contains(t, page, `<input type="checkbox" id="live-pause">`, path)
		require.Equal(t, 1, strings.Count(page, "if(window.tripsagaLive)return"), "%s: one refresh script", path)
		require.NotContains(t, page, `http-equiv="refresh"`, path)
	}
}
