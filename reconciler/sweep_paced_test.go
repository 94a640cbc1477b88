package reconciler

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/provider"
)

// TestSweepOverManyPagesOutlivesTheIdleTimeout: the sweep's transaction
// waits while the companies are listed, one after another with a rest
// after each page; a statement after each page keeps PostgreSQL from
// ending it as idle in transaction, however long the listing takes. Here
// the session ends a transaction idle for 4 s, and the listing takes
// about 13 s (three companies, four pages each, every page answered after
// 1 s): each wait between statements is a page and its rest, about 1.3 s.
func TestSweepOverManyPagesOutlivesTheIdleTimeout(t *testing.T) {
	t.Parallel()
	const pages = 4
	companies := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Second) // a slow company: the listing is long
		n, _ := strconv.Atoi(r.URL.Query().Get("after"))
		page := map[string]any{"items": []map[string]any{{
			"key": "K-" + strconv.Itoa(n), "trip_id": "not a trip", "status": "released",
			"hold_id": "H-" + strconv.Itoa(n), "charge_id": "C-" + strconv.Itoa(n), "booking_id": "B-" + strconv.Itoa(n),
		}}}
		if n+1 < pages {
			page["next"] = strconv.Itoa(n + 1)
		}
		_ = json.NewEncoder(w).Encode(page)
	}))
	t.Cleanup(companies.Close)
	b := setup(t, func(c *Config) {
		pc := c.Pool.Config()
		pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "4000"
		pool, err := pgxpool.NewWithConfig(context.Background(), pc)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		c.Pool = pool
		c.Companies = map[string]*provider.Client{
			"hotel":   provider.Hotel(companies.URL),
			"payment": provider.Payments(companies.URL),
			"car":     provider.Cars(companies.URL),
		}
		for _, cl := range c.Companies {
			cl.DefaultTimeout = time.Minute // the company is slow on purpose
		}
	})
	var timeout string
	require.NoError(t, b.r.cfg.Pool.QueryRow(context.Background(), "SHOW idle_in_transaction_session_timeout").Scan(&timeout))
	require.Equal(t, "4s", timeout, "the sweep's sessions end a transaction idle for 4 s")
	res, err := b.r.Sweep(context.Background())
	require.NoError(t, err, "the sweep's transaction lived through a listing longer than the idle timeout")
	require.Equal(t, 3*pages, res.Records, "every page of every company read")
	require.Greater(t, res.Duration, 4*time.Second, "the listing outlasted the idle timeout, so the test tests it")
}
