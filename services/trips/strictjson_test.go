package trips

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDecodeRequestRefusesDuplicateNamesAndLoneSurrogates(t *testing.T) {
	day := time.Now().UTC().AddDate(0, 0, 30)
	d := day.Format(time.DateOnly)
	r := day.AddDate(0, 0, 2).Format(time.DateOnly)
	good := `{"traveler":{"name":"Ada Example","email":"ada@example.com"},"hotel":{"property_id":"P-100","check_in":"` + d + `","nights":2},"car":{"car_class":"compact","pickup":"` + d + `","return":"` + r + `"},"payment":{"card_token":"tok_visa_ok","amount_cents":33000,"currency":"USD"}}`
	_, errs := DecodeRequest(strings.NewReader(good), time.Now())
	require.Empty(t, errs)
	// A surrogate pair is one character: accepted.
	_, errs = DecodeRequest(strings.NewReader(strings.Replace(good, "Ada Example", `Ada \ud83d\ude00 Example`, 1)), time.Now())
	require.Empty(t, errs)

	for _, tc := range []struct{ body, field, says string }{
		{strings.Replace(good, `"traveler":{`, `"traveler":{"name":"Bob","email":"b@example.com"},"traveler":{`, 1), "traveler", "more than once"},
		{strings.Replace(good, `"nights":2`, `"nights":2,"nights":3`, 1), "hotel.nights", "more than once"},
		{strings.Replace(good, "Ada Example", `A\ud800B`, 1), "traveler.name", "lone UTF-16 surrogate"},
		{strings.Replace(good, "Ada Example", `A\udc00`, 1), "traveler.name", "lone UTF-16 surrogate"},
		{strings.Replace(good, "Ada Example", `A\ud800`, 1), "traveler.name", "lone UTF-16 surrogate"},
	} {
		_, errs := DecodeRequest(strings.NewReader(tc.body), time.Now())
		require.NotEmpty(t, errs, tc.body)
		require.Equal(t, tc.field, errs[0].Field, tc.body)
		require.Contains(t, errs[0].Detail, tc.says)
	}
}
