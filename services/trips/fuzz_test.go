package trips

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
)

// fuzzNow is the fixed "now" of the fuzz targets, so that a seed's dates
// stay valid.
var fuzzNow = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

const fuzzGood = `{"traveler":{"name":"Ada Example","email":"ada@example.com"},"hotel":{"property_id":"P-100","check_in":"2026-07-01","nights":2},"car":{"car_class":"compact","pickup":"2026-07-01","return":"2026-07-03"},"payment":{"card_token":"tok_visa_ok","amount_cents":33000,"currency":"USD"}}`

// requireNamed fails unless every error names a field: a dotted path with
// its JSON pointer, or the whole body ("#").
func requireNamed(t *testing.T, errs []FieldError) {
	t.Helper()
	for _, e := range errs {
		if e.Detail == "" || !strings.HasPrefix(e.Pointer, "#") || (e.Field == "") != (e.Pointer == "#") {
			t.Fatalf("error names no field: %+v", e)
		}
	}
}

// FuzzDecodeRequest feeds arbitrary bodies to the trips API's strict
// decoder and validator: nothing may panic, every error names a field, and
// an accepted request validates again and, sent again as JSON, is accepted
// as the same request.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		fuzzGood,
		strings.Replace(fuzzGood, "Ada Example", `Ada \ud83d\ude00 Example`, 1),
		strings.Replace(fuzzGood, `"nights":2`, `"nights":2,"nights":3`, 1),
		strings.Replace(fuzzGood, "Ada Example", `A\ud800B`, 1),
		strings.Replace(fuzzGood, `"amount_cents":33000`, `"amount_cents":-500`, 1),
		strings.Replace(fuzzGood, `"amount_cents":33000`, `"amount_cents":1e3`, 1),
		strings.Replace(fuzzGood, `"check_in":"2026-07-01"`, `"check_in":"2025-01-01"`, 1),
		strings.Replace(fuzzGood, `"currency":"USD"`, `"currency":"usd","extra":[{}]`, 1),
		strings.Replace(fuzzGood, `"email":"ada@example.com"`, `"email":"ada@-bad..example"`, 1),
		strings.Replace(fuzzGood, `"traveler":{`, `"traveler":7,"x":{`, 1),
		`{}`, `[]`, `null`, `{"a":1} x`, "\xff{}", `{"hotel":{"nights":"2"}}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, errs := DecodeRequest(bytes.NewReader(body), fuzzNow)
		requireNamed(t, errs)
		if len(errs) > 0 {
			return
		}
		if err := req.ValidateNew(fuzzNow); err != nil {
			t.Fatalf("accepted request does not validate again: %v", err)
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("accepted request does not validate: %v", err)
		}
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, errs := DecodeRequest(bytes.NewReader(b), fuzzNow)
		if len(errs) > 0 {
			t.Fatalf("accepted request %s refused when sent again: %v", b, errs)
		}
		if again != req {
			t.Fatalf("request changed when sent again: %+v then %+v", req, again)
		}
	})
}

// FuzzValidate feeds arbitrary field values to events.TripRequest's
// Validate and ValidateNew: nothing may panic, a refusal is a
// *RequestError naming known fields, and a valid request survives a JSON
// round trip.
func FuzzValidate(f *testing.F) {
	f.Add("Ada Example", "ada@example.com", "P-100", "2026-07-01", 2, "compact", "2026-07-01", "2026-07-03", "tok_visa_ok", int64(33000), "USD")
	f.Add("", "ada@bücher.example", "P\n1", "2026-02-30", 0, "", "2026-07-03", "2026-07-01", "", int64(-500), "usd")
	f.Add("A\u2028B", "a@b", "P-1", "9999-12-31", 1<<30, "x", "0000-01-01", "x", "t", int64(1)<<62, "XXX")
	f.Add(strings.Repeat("a", 300), "\"a b\"@example.com", "P-1", "2026-06-01", 30, "suv", "2026-06-01", "2026-07-01", "tok", int64(1), "EUR")
	fields := map[string]bool{}
	for name, shape := range requestShape {
		for leaf := range shape {
			fields[name+"."+leaf] = true
		}
	}
	f.Fuzz(func(t *testing.T, name, email, property, checkIn string, nights int, class, pickup, ret, token string, amount int64, currency string) {
		r := events.TripRequest{
			Traveler: events.Person{Name: name, Email: email},
			Hotel:    events.HotelRequest{PropertyID: property, CheckIn: checkIn, Nights: nights},
			Car:      events.CarRequest{CarClass: class, Pickup: pickup, Return: ret},
			Payment:  events.PaymentRequest{CardToken: token, AmountCents: amount, Currency: currency},
		}
		for _, err := range []error{r.Validate(), r.ValidateNew(fuzzNow)} {
			if err == nil {
				continue
			}
			var re *events.RequestError
			if !errors.As(err, &re) || len(re.Fields) == 0 || !errors.Is(err, events.ErrInvalidRequest) {
				t.Fatalf("refusal is not a *RequestError naming fields: %v", err)
			}
			for _, fe := range re.Fields {
				if !fields[fe.Field] || fe.Detail == "" {
					t.Fatalf("error names no known field: %+v", fe)
				}
			}
		}
		if r.Validate() != nil {
			return
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var again events.TripRequest
		if err := json.Unmarshal(b, &again); err != nil || again != r {
			t.Fatalf("valid request changed in JSON: %+v then %+v (%v)", r, again, err)
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("valid request does not validate again: %v", err)
		}
	})
}

func TestDecodeRequestReadsAtMostMaxBodyBytes(t *testing.T) {
	body := `{"traveler":{"name":"` + strings.Repeat("a", MaxBodyBytes) + `"}}`
	_, errs := DecodeRequest(strings.NewReader(body), fuzzNow)
	require.Len(t, errs, 1)
	require.Equal(t, "#", errs[0].Pointer)
	require.Contains(t, errs[0].Detail, "larger than")
	_, errs = DecodeRequest(strings.NewReader(fuzzGood), fuzzNow)
	require.Empty(t, errs)
}

// Found by FuzzDecodeRequest: a member named "" was refused with field ""
// like an error about the whole body.
func TestDecodeRequestNamesAnEmptyMemberName(t *testing.T) {
	for _, body := range []string{`{"":{}}`, strings.Replace(fuzzGood, `{"traveler"`, `{"":1,"":2,"traveler"`, 1)} {
		_, errs := DecodeRequest(strings.NewReader(body), fuzzNow)
		require.NotEmpty(t, errs, body)
		require.Equal(t, `""`, errs[0].Field, body)
		require.Equal(t, "#/", errs[0].Pointer, body)
	}
}
