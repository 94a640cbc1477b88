package reconciler

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/provider"
)

// TestSweepSaysWhatItCouldNotUse: a car firm whose records lack a usable
// trip_id, then cannot be read at all, as a new user would meet it.
func TestSweepSaysWhatItCouldNotUse(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	var b3 atomic.Value // B-3's status at the cars company
	b3.Store("booked")
	cars := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "maintenance", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"items":[
			{"booking_id":"B-1","idempotency_key":"K-1","status":"booked"},
			{"booking_id":"B-2","idempotency_key":"K-2","status":"booked","trip_id":42},
			{"booking_id":"B-3","idempotency_key":"K-3","status":"`+b3.Load().(string)+`","trip_id":"not a trip"},
			{"booking_id":"B-4","idempotency_key":"K-4","status":"canceled"}
		],"next":""}`)
	}))
	t.Cleanup(cars.Close)
	b := setup(t, func(c *Config) { c.Companies["car"] = provider.Cars(cars.URL) })
	ctx := context.Background()

	res, err := b.r.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, res.Open[FindingUnattributed], "B-4 is canceled: nothing of it is in force")
	fs, err := b.r.Findings(ctx, false)
	require.NoError(t, err)
	got := map[string]string{}
	for _, f := range fs {
		require.Equal(t, FindingUnattributed, f.Kind)
		got[f.TripID] = f.Detail
	}
	require.Contains(t, got["?cars/B-1"], "cars record B-1 has no trip_id")
	require.Contains(t, got["?cars/B-2"], "not a string (float64 42)")
	require.Contains(t, got["?cars/B-3"], `trip_id "not a trip" that is not a trip id`)
	require.Equal(t, 3.0, gauge(t, b.r.metrics.findings.WithLabelValues(FindingUnattributed)))
	require.Equal(t, 0.0, gauge(t, b.r.metrics.unreadable.WithLabelValues("cars")))

	down.Store(true)
	res, err = b.r.Sweep(ctx)
	require.Error(t, err)
	var ue *UnreadableError
	require.ErrorAs(t, err, &ue)
	require.Contains(t, res.Unreadable["cars"], "503")
	require.NotContains(t, res.Unreadable, "hotel", "the others were read")
	require.Equal(t, 1.0, gauge(t, b.r.metrics.unreadable.WithLabelValues("cars")))
	require.Equal(t, 0.0, gauge(t, b.r.metrics.unreadable.WithLabelValues("hotel")))
	fs, err = b.r.Findings(ctx, false)
	require.NoError(t, err)
	require.Len(t, fs, 3, "a sweep that could not read judges nothing: the findings stay")

	mux := http.NewServeMux()
	b.r.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(page), "could not read the records of cars")
	resp, err = http.Get(srv.URL + "/findings")
	require.NoError(t, err)
	var body struct{ Items []Finding }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	require.Len(t, body.Items, 3)

	down.Store(false)
	_, err = b.r.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 0.0, gauge(t, b.r.metrics.unreadable.WithLabelValues("cars")))

	// Issue 19 item 4: B-3 canceled at the company leaves nothing in
	// force, and its finding closes by itself at the next sweep.
	b3.Store("canceled")
	res, err = b.r.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.Open[FindingUnattributed])
	require.Equal(t, 1, res.Resolved)
	fs, err = b.r.Findings(ctx, false)
	require.NoError(t, err)
	for _, f := range fs {
		require.NotEqual(t, "?cars/B-3", f.TripID)
	}
}

func gauge(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, g.Write(&m))
	return m.GetGauge().GetValue()
}
