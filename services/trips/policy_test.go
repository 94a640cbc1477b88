package trips

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPolicyFee: every band of the shipped policy and its boundaries, odd
// amounts, one night and many, and the sum rule fee + refund == charge
// with neither negative and the refund never above the charge.
func TestPolicyFee(t *testing.T) {
	p := DefaultPolicy()
	checkIn := time.Date(2027, 3, 10, 0, 0, 0, 0, time.UTC) // 00:00 UTC of the check-in date
	before := func(d time.Duration) time.Time { return checkIn.Add(-d) }
	const day = 24 * time.Hour
	for _, tc := range []struct {
		name    string
		charged int64
		nights  int
		now     time.Time
		band    string
		fee     int64
	}{
		{"30 days before: free", 33000, 2, before(30 * day), "free until 7 days before check-in", 0},
		{"exactly 7 days before: still free", 33001, 2, before(7 * day), "free until 7 days before check-in", 0},
		{"7 days minus 1 ns: half a night", 33000, 2, before(7*day - 1), "inside 7 days", 8250},
		{"inside 7 days, odd amount: rounded down", 33001, 2, before(5 * day), "inside 7 days", 8250},    // 33001/2/2 = 8250.25
		{"inside 7 days, odd cents, 3 nights", 10001, 3, before(3 * day), "inside 7 days", 1666},         // 10001/3/2 = 1666.83
		{"inside 7 days, one cent charged", 1, 1, before(3 * day), "inside 7 days", 0},                   // 0.5 rounded down
		{"inside 7 days, 3 cents, one night", 3, 1, before(3 * day), "inside 7 days", 1},                 // 1.5
		{"exactly 48 h before: still half", 33000, 2, before(48 * time.Hour), "inside 7 days", 8250},     // not inside 48 h
		{"48 h minus 1 ns: a whole night", 33000, 2, before(48*time.Hour - 1), "inside 48 hours", 16500}, //
		{"inside 48 h, odd amount", 33001, 2, before(time.Hour), "inside 48 hours", 16500},               // 16500.5
		{"inside 48 h, one night: the whole charge", 33001, 1, before(time.Hour), "inside 48 hours", 33001},
		{"after check-in: a whole night", 9999, 3, checkIn.Add(5 * time.Hour), "inside 48 hours", 3333},
		{"a large amount: no overflow", 100000000000, 30, before(day), "inside 48 hours", 3333333333},
		{"the largest int64: exact", math.MaxInt64, 7, before(3 * day), "inside 7 days", math.MaxInt64 / 14},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := p.Fee(tc.charged, tc.nights, checkIn, tc.now)
			require.Equal(t, tc.band, f.Band)
			require.Equal(t, tc.fee, f.FeeCents, "fee")
			require.Equal(t, tc.charged, f.FeeCents+f.RefundCents, "fee + refund must be the charge exactly")
			require.GreaterOrEqual(t, f.FeeCents, int64(0))
			require.GreaterOrEqual(t, f.RefundCents, int64(0))
			require.LessOrEqual(t, f.RefundCents, tc.charged, "never more refunded than charged")
		})
	}
	t.Run("every amount from 1 to 2000 cents and 1 to 30 nights adds up", func(t *testing.T) {
		for charged := int64(1); charged <= 2000; charged++ {
			for nights := 1; nights <= 30; nights++ {
				for _, now := range []time.Time{before(30 * day), before(3 * day), before(time.Hour)} {
					f := p.Fee(charged, nights, checkIn, now)
					if f.FeeCents < 0 || f.RefundCents < 0 || f.FeeCents+f.RefundCents != charged || f.FeeCents > charged {
						t.Fatalf("charged %d, %d nights, %s: %+v", charged, nights, now, f)
					}
				}
			}
		}
	})
}

// TestParsePolicy: the policy is data; a bad file is refused naming the
// field, and a file's bands are used in place of the shipped ones.
func TestParsePolicy(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"free_band":"free","bands":[{"name":"x","within_hours":0,"percent_of_one_night":50}]}`, "bands[0].within_hours"},
		{`{"free_band":"free","bands":[{"name":"x","within_hours":24,"percent_of_one_night":101}]}`, "bands[0].percent_of_one_night"},
		{`{"free_band":"free","bands":[{"name":"","within_hours":24,"percent_of_one_night":1}]}`, "bands[0].name"},
		{`{"free_band":"free","bands":[{"name":"a","within_hours":24,"percent_of_one_night":1},{"name":"b","within_hours":24,"percent_of_one_night":2}]}`, "bands[1].within_hours"},
		{`{"bands":[]}`, "free_band"},
		{`{"free_band":"free","bands":[],"percent":3}`, "percent"},
	} {
		_, err := ParsePolicy([]byte(tc.body))
		require.ErrorIs(t, err, ErrInvalidPolicy, tc.body)
		require.ErrorContains(t, err, tc.want, tc.body)
	}
	path := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"free_band":"free","bands":[{"name":"inside a day","within_hours":24,"percent_of_one_night":10}]}`), 0o600))
	t.Setenv(PolicyFileVar, path)
	p, err := LoadPolicy()
	require.NoError(t, err)
	checkIn := time.Date(2027, 3, 10, 0, 0, 0, 0, time.UTC)
	require.Equal(t, Fee{Band: "inside a day", FeeCents: 1000, RefundCents: 9000}, p.Fee(10000, 1, checkIn, checkIn.Add(-time.Hour)))
	require.Equal(t, Fee{Band: "free", FeeCents: 0, RefundCents: 10000}, p.Fee(10000, 1, checkIn, checkIn.Add(-30*time.Hour)))
	t.Setenv(PolicyFileVar, filepath.Join(t.TempDir(), "missing.json"))
	_, err = LoadPolicy()
	require.ErrorContains(t, err, fmt.Sprint(PolicyFileVar))
}

// TestMoney: the email writes amounts in the currency's own decimals.
func TestMoney(t *testing.T) {
	require.Equal(t, "82.50 EUR", money(8250, "EUR"))
	require.Equal(t, "0.05 USD", money(5, "USD"))
	require.Equal(t, "12345 JPY", money(12345, "JPY"))
	require.Equal(t, "1.234 KWD", money(1234, "KWD"))
}
