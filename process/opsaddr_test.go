package process

import (
	"context"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// serveProcess opens a process (no NATS) as the hotel role with env's
// addresses and serves it until the test ends.
func serveProcess(t *testing.T, env Env) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	admin := testenv.Postgres(t)
	env.DatabaseURL = testenv.Roles(t, admin)["hotel"]
	p, err := Open(ctx, "hotel", "hotel", env, false, tripsql.SetSaga)
	require.NoError(t, err)
	p.SetReady()
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		p.Close()
	})
	testenv.Eventually(t, func() bool {
		resp, err := http.Get("http://" + env.HTTPAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "the process serves")
}

// TestOpsAddr: with OPS_ADDR set, /metrics and /debug/pprof answer there
// and 404 on HTTP_ADDR; unset, HTTP_ADDR serves them as before.
func TestOpsAddr(t *testing.T) {
	t.Run("set", func(t *testing.T) {
		env := Env{HTTPAddr: freeAddr(t), OpsAddr: freeAddr(t)}
		serveProcess(t, env)
		for _, path := range []string{"/metrics", "/debug/pprof/"} {
			a := get(t, http.MethodGet, "http://"+env.HTTPAddr+path)
			require.Equal(t, http.StatusNotFound, a.code, "HTTP_ADDR %s", path)
			a = get(t, http.MethodGet, "http://"+env.OpsAddr+path)
			require.Equal(t, http.StatusOK, a.code, "OPS_ADDR %s", path)
		}
		require.Contains(t, get(t, http.MethodGet, "http://"+env.OpsAddr+"/metrics").body, "go_goroutines")
		// The API stays on HTTP_ADDR only.
		require.Equal(t, http.StatusOK, get(t, http.MethodGet, "http://"+env.HTTPAddr+"/readyz").code)
		require.Equal(t, http.StatusNotFound, get(t, http.MethodGet, "http://"+env.OpsAddr+"/readyz").code)
	})
	t.Run("unset", func(t *testing.T) {
		env := Env{HTTPAddr: freeAddr(t)}
		serveProcess(t, env)
		for _, path := range []string{"/metrics", "/debug/pprof/"} {
			require.Equal(t, http.StatusOK, get(t, http.MethodGet, "http://"+env.HTTPAddr+path).code, path)
		}
	})
}
