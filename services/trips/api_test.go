package trips

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const valid = `{"traveler":{"name":"Ada Example","email":"ada@example.com"},"hotel":{"property_id":"P-100","check_in":"2026-12-18","nights":2},"car":{"car_class":"compact","pickup":"2026-12-18","return":"2026-12-20"},"payment":{"card_token":"tok_visa_ok","amount_cents":33000,"currency":"USD"}}`

// testNow is the day the decoding tests book on.
var testNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func fields(errs []FieldError) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Field)
	}
	return out
}

func TestDecodeRequest(t *testing.T) {
	req, errs := DecodeRequest(strings.NewReader(valid), testNow)
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
		"Body not UTF-8":                          {strings.Replace(valid, "Ada", "Ad\xff", 1), []string{""}},
		"NUL escaped in a string":                 {strings.Replace(valid, "Ada", `Ada\u0000`, 1), []string{"traveler.name"}},
		"Unknown currency":                        {strings.Replace(valid, "USD", "ZZZ", 1), []string{"payment.currency"}},
		"Check-in in the past":                    {strings.Replace(valid, `"check_in":"2026-12-18"`, `"check_in":"2020-01-01"`, 1), []string{"car.pickup", "hotel.check_in"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, errs := DecodeRequest(strings.NewReader(c.body), testNow)
			require.ElementsMatch(t, c.want, fields(errs))
		})
	}
}

// Item 12: an integer out of range, even past int64, says the range.
func TestDecodeRequestSaysTheRange(t *testing.T) {
	for _, n := range []string{"99999999999999999999", "-99999999999999999999", "0", "31", "2.5", "1e3", `"2"`} {
		_, errs := DecodeRequest(strings.NewReader(strings.Replace(valid, `"nights":2`, `"nights":`+n, 1)), testNow)
		require.Equal(t, []FieldError{{Field: "hotel.nights", Pointer: "#/hotel/nights", Detail: "must be a JSON integer from 1 to 30"}}, errs, n)
	}
	_, errs := DecodeRequest(strings.NewReader(strings.Replace(valid, "33000", "99999999999999999999", 1)), testNow)
	require.Equal(t, []FieldError{{Field: "payment.amount_cents", Pointer: "#/payment/amount_cents", Detail: "must be a JSON integer from 1 to 100000000000"}}, errs)
}

func TestCheckKey(t *testing.T) {
	require.Empty(t, CheckKey(""))
	require.Empty(t, CheckKey(strings.Repeat("k", 255)))
	require.Empty(t, CheckKey(strings.Repeat("ключ", 63)), "252 characters, 504 octets")
	require.Equal(t, "must be at most 255 characters, not 256", CheckKey(strings.Repeat("k", 256)))
	require.Equal(t, "must be at most 255 characters, not 256", CheckKey(strings.Repeat("é", 256)), "characters, not octets")
	require.Equal(t, "must be UTF-8 text", CheckKey("k\xff"))
	require.Equal(t, "must not contain control characters (U+0000)", CheckKey("k\x00"))
}

func TestOneLine(t *testing.T) {
	require.Equal(t, "Ada Lovelace", oneLine("Ada Lovelace"))
	require.Equal(t, "Ada  Bcc: x@example.com", oneLine("Ada\r\nBcc: x@example.com"))
	require.Equal(t, "a b c d e", oneLine("a\u2028b\u0085c\x00d\xffe"))
	// Issue 19 item 7: a bidirectional override or a zero-width space in
	// a name reached the mails as is, reordering or hiding the text.
	require.Equal(t, "Ada <U+202E>ecalevoL<U+202C> and Bob<U+200B>by", oneLine("Ada \u202eecalevoL\u202c and Bob\u200bby"))
}

func TestFingerprintIgnoresKeyOrderAndSpacing(t *testing.T) {
	a, errs := DecodeRequest(strings.NewReader(valid), testNow)
	require.Empty(t, errs)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(valid), &m))
	reordered, err := json.MarshalIndent(m, "", "  ") // keys sorted, other spacing
	require.NoError(t, err)
	require.NotEqual(t, valid, string(reordered))
	b, errs := DecodeRequest(strings.NewReader(string(reordered)), testNow)
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
