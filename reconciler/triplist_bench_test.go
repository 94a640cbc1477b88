package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkTripList1M times the trip list's queries on a projection of
// 1,000,000 trips (90 % confirmed, 5 % canceled, 3 % pending, 2 %
// canceling; one a second over 11.6 days; a tenth under the charge-last
// version), 1,000 of them waiting on an open step (400 refunds
// compensating with an error, 300 cars unknown, 300 holds started) and
// 500 with an open stuck finding. Each sub-benchmark reports ms/op of one
// page (50 trips) or count, as the console runs it (a read-only
// transaction planned per call).
//
//	go test ./reconciler -run '^$' -bench TripList1M -benchtime 20x
func BenchmarkTripList1M(b *testing.B) {
	bu := setup(b, nil)
	ctx := context.Background()
	start := time.Now()
	for _, q := range []string{
		`INSERT INTO trip_view (trip_id, seen, status, settled, requested, mailed, events, first_event_at, last_event_at, version)
		 SELECT 'T-' || lpad(i::text, 8, '0'), '{trip.requested,hotel.held,payment.charged,car.booked}',
		        CASE WHEN i % 100 < 90 THEN 'confirmed' WHEN i % 100 < 95 THEN 'canceled' WHEN i % 100 < 98 THEN 'pending' ELSE 'canceling' END,
		        CASE WHEN i % 100 < 90 THEN 'confirmed' WHEN i % 100 < 95 THEN 'canceled' END,
		        true, i % 100 < 90, 5, now() - i * interval '1 second', now() - i * interval '1 second' + interval '2 seconds',
		        CASE WHEN i % 10 = 0 THEN 'hotel,car,payment' ELSE 'hotel,payment,car' END
		 FROM generate_series(1, 1000000) AS i`,
		`INSERT INTO open_steps (trip_id, service, step, state, attempts, last_error, since, read_at)
		 SELECT 'T-' || lpad((i * 100 + 98)::text, 8, '0'),
		        CASE WHEN i <= 400 THEN 'payment' WHEN i <= 700 THEN 'car' ELSE 'hotel' END,
		        CASE WHEN i <= 400 THEN 'payment' WHEN i <= 700 THEN 'car' ELSE 'hotel' END,
		        CASE WHEN i <= 400 THEN 'compensating' WHEN i <= 700 THEN 'unknown' ELSE 'started' END,
		        i % 12, CASE WHEN i <= 400 THEN 'refund: 503 Service Unavailable' ELSE 'timeout' END, now(), now()
		 FROM generate_series(1, 1000) AS i`,
		`INSERT INTO findings (trip_id, kind, detail) SELECT 'T-' || lpad((i * 100 + 96)::text, 8, '0'), 'stuck', 'pending for 1h'
		 FROM generate_series(1, 500) AS i`,
		`ANALYZE trip_view`, `ANALYZE open_steps`, `ANALYZE findings`,
	} {
		_, err := bu.pool.Exec(ctx, q)
		require.NoError(b, err)
	}
	b.Logf("1,000,000 trips loaded in %s", time.Since(start).Round(time.Millisecond))
	now := time.Now()
	cases := []struct {
		name  string
		f     TripFilter
		order TripOrder
		count bool
	}{
		{"newest/page", TripFilter{}, Newest, false},
		{"oldest/page", TripFilter{}, Oldest, false},
		{"status=canceling/oldest", TripFilter{Status: "canceling"}, Oldest, false},
		{"step=payment,state=compensating", TripFilter{Step: "payment", State: "compensating"}, Oldest, false},
		{"error=503", TripFilter{Error: "503"}, Newest, false},
		{"company=car,min_attempts=6", TripFilter{Company: "car", MinAttempts: 6}, Newest, false},
		{"finding=stuck", TripFilter{Finding: FindingStuck}, Oldest, false},
		{"version=charge-last", TripFilter{Version: "hotel,car,payment"}, Newest, false},
		{"range=1h,status=pending", TripFilter{Status: "pending", From: now.Add(-50 * time.Hour), To: now.Add(-49 * time.Hour)}, Oldest, false},
		{"min_age=10d", TripFilter{MinAge: 240 * time.Hour}, Newest, false},
		{"count/all", TripFilter{}, Newest, true},
		{"count/status=canceling", TripFilter{Status: "canceling"}, Newest, true},
		{"count/step=payment,state=compensating", TripFilter{Step: "payment", State: "compensating"}, Newest, true},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var page TripPage
			var err error
			t0 := time.Now()
			for b.Loop() {
				page, err = bu.r.ListTrips(ctx, c.f, c.order, "", DefaultTripPage, c.count)
				require.NoError(b, err)
			}
			b.ReportMetric(float64(time.Since(t0).Microseconds())/1000/float64(b.N), "ms/op")
			if c.count {
				b.ReportMetric(float64(*page.Count), "trips")
			} else {
				b.ReportMetric(float64(len(page.Items)), "rows")
			}
		})
	}
	// A deep page: the 200th page of the newest, through its cursor.
	b.Run("newest/page-200", func(b *testing.B) {
		cursor := ""
		for range 199 {
			page, err := bu.r.ListTrips(ctx, TripFilter{}, Newest, cursor, DefaultTripPage, false)
			require.NoError(b, err)
			cursor = page.Next
		}
		t0 := time.Now()
		for b.Loop() {
			_, err := bu.r.ListTrips(ctx, TripFilter{}, Newest, cursor, DefaultTripPage, false)
			require.NoError(b, err)
		}
		b.ReportMetric(float64(time.Since(t0).Microseconds())/1000/float64(b.N), "ms/op")
	})
}
