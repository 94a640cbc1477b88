package trips

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const valid = `{"traveler":{"name":"Ada Example","email":"ada@example.com"},"hotel":{"property_id":"P-100","check_in":"2026-12-18","nights":2},"car":{"car_class":"compact","pickup":"2026-12-18","return":"2026-12-20"},"payment":{"card_token":"tok_visa_ok","amount_cents":33000,"currency":"USD"}}`

func fields(errs []FieldError) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Field)
	}
	return out
}

func TestDecodeRequest(t *testing.T) {
	req, errs := DecodeRequest(strings.NewReader(valid))
	require.Empty(t, errs)
	require.EqualValues(t, 33000, req.Payment.AmountCents)

	cases := map[string]struct {
		body string
		want []string
	}{
		"Empty object names every required field": {`{}`, []string{"traveler.name", "traveler.email", "hotel.property_id", "hotel.check_in", "hotel.nights", "car.car_class", "car.pickup", "car.return", "payment.card_token", "payment.amount_cents", "payment.currency"}},
		"Wrong type names the field":              {strings.Replace(valid, "33000", `"lots"`, 1), []string{"payment.amount_cents"}},
		"Unknown nested field is named in full":   {strings.Replace(valid, `"nights":2`, `"nights":2,"stars":5`, 1), []string{"hotel.stars"}},
		"A type error hides no other error":       {strings.NewReplacer(`"nights":2`, `"nights":"2"`, "ada@example.com", "", "USD", "usd").Replace(valid), []string{"hotel.nights", "payment.currency", "traveler.email"}},
		"Fraction is not an integer":              {strings.Replace(valid, "33000", "330.5", 1), []string{"payment.amount_cents"}},
		"Section of the wrong type":               {strings.Replace(valid, `"car":{"car_class":"compact","pickup":"2026-12-18","return":"2026-12-20"}`, `"car":"compact"`, 1), []string{"car"}},
		"Top-level array":                         {`[]`, []string{""}},
		"Impossible date":                         {strings.Replace(valid, "2026-12-18\",\"nights", "2026-02-30\",\"nights", 1), []string{"hotel.check_in"}},
		"Return before pickup":                    {strings.Replace(valid, `"return":"2026-12-20"`, `"return":"2026-12-01"`, 1), []string{"car.return"}},
		"Lower-case currency":                     {strings.Replace(valid, "USD", "usd", 1), []string{"payment.currency"}},
		"Display-name email":                      {strings.Replace(valid, "ada@example.com", "Ada <ada@example.com>", 1), []string{"traveler.email"}},
		"Not JSON":                                {`nope`, []string{""}},
		"Trailing data":                           {valid + `{}`, []string{""}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, errs := DecodeRequest(strings.NewReader(c.body))
			require.ElementsMatch(t, c.want, fields(errs))
		})
	}
}

func TestFingerprintIgnoresKeyOrderAndSpacing(t *testing.T) {
	a, errs := DecodeRequest(strings.NewReader(valid))
	require.Empty(t, errs)
	b, errs := DecodeRequest(strings.NewReader(`{ "payment":{"currency":"USD","amount_cents":33000,"card_token":"tok_visa_ok"},` + valid[1:]))
	require.Empty(t, errs)
	require.Equal(t, Fingerprint(a), Fingerprint(b))
	b.Payment.AmountCents++
	require.NotEqual(t, Fingerprint(a), Fingerprint(b))
}

func TestParseWait(t *testing.T) {
	cases := []struct {
		prefer  string
		want    time.Duration
		applied bool
	}{
		{"", WaitDefault, false},
		{"wait=5", 5 * time.Second, true},
		{"respond-async, wait=0", 0, true},
		{"wait=100", WaitMax, true},
		{"wait=abc", WaitDefault, false},
		{"return=minimal", WaitDefault, false},
	}
	for _, c := range cases {
		h := http.Header{}
		if c.prefer != "" {
			h.Set("Prefer", c.prefer)
		}
		got, applied := ParseWait(h)
		require.Equal(t, c.want, got, c.prefer)
		require.Equal(t, c.applied, applied, c.prefer)
	}
}
