package events

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/currency"
)

// now is the day the tests book on.
var now = time.Date(2026, 11, 30, 23, 30, 0, 0, time.UTC)

func validRequest() TripRequest {
	return TripRequest{
		Traveler: Person{Name: "Ada Example", Email: "ada@example.com"},
		Hotel:    HotelRequest{PropertyID: "P-100", CheckIn: "2026-12-18", Nights: 2},
		Car:      CarRequest{CarClass: "compact", Pickup: "2026-12-18", Return: "2026-12-20"},
		Payment:  PaymentRequest{CardToken: "tok_visa_ok", AmountCents: 33000, Currency: "USD"},
	}
}

// invalid returns the fields ValidateNew names for r, and checks the error
// is a *RequestError wrapping ErrInvalidRequest.
func invalid(t *testing.T, r TripRequest) map[string]string {
	t.Helper()
	err := r.ValidateNew(now)
	if err == nil {
		return nil
	}
	require.ErrorIs(t, err, ErrInvalidRequest)
	var re *RequestError
	require.True(t, errors.As(err, &re))
	out := map[string]string{}
	for _, f := range re.Fields {
		require.Equal(t, "#/"+strings.ReplaceAll(f.Field, ".", "/"), f.Pointer)
		out[f.Field] = f.Detail
	}
	return out
}

func TestValidateAcceptsAValidTrip(t *testing.T) {
	require.NoError(t, validRequest().Validate())
	require.NoError(t, validRequest().ValidateNew(now))
	r := validRequest()
	r.Traveler.Name = "Zoë O’Brien-Łukasiewicz 山田"
	r.Traveler.Email = "zoë@bücher.example"
	r.Hotel.CheckIn, r.Car.Pickup, r.Car.Return = "2026-11-30", "2026-11-30", "2026-12-01"
	r.Payment.Currency = "JPY"
	require.Nil(t, invalid(t, r), "non-ASCII names and IDN domains; check-in today (UTC)")
}

// Item 7: dates in the past or absurd years, and the booking horizon.
func TestValidateDatesAgainstToday(t *testing.T) {
	cases := map[string]struct {
		mod  func(*TripRequest)
		want map[string]string
	}{
		"check-in in the past": {func(r *TripRequest) {
			r.Hotel.CheckIn, r.Car.Pickup, r.Car.Return = "2020-01-01", "2020-01-01", "2020-01-03"
		},
			map[string]string{"hotel.check_in": "must be today (2026-11-30, UTC) or later", "car.pickup": "must be today (2026-11-30, UTC) or later"}},
		"year zero": {func(r *TripRequest) {
			r.Hotel.CheckIn, r.Car.Pickup, r.Car.Return = "0000-01-01", "0000-01-01", "0000-01-02"
		},
			map[string]string{"hotel.check_in": "must be today (2026-11-30, UTC) or later", "car.pickup": "must be today (2026-11-30, UTC) or later"}},
		"yesterday": {func(r *TripRequest) { r.Hotel.CheckIn = "2026-11-29"; r.Car.Pickup = "2026-11-30" },
			map[string]string{"hotel.check_in": "must be today (2026-11-30, UTC) or later"}},
		"beyond 18 months": {func(r *TripRequest) {
			r.Hotel.CheckIn, r.Car.Pickup, r.Car.Return = "2028-05-31", "2028-05-31", "2028-06-01"
		},
			map[string]string{"hotel.check_in": "must be at most 18 months ahead: on or before 2028-05-30"}},
		"far future year": {func(r *TripRequest) {
			r.Hotel.CheckIn, r.Car.Pickup, r.Car.Return = "9999-12-01", "9999-12-01", "9999-12-03"
		},
			map[string]string{"hotel.check_in": "must be at most 18 months ahead: on or before 2028-05-30"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := validRequest()
			c.mod(&r)
			require.Equal(t, c.want, invalid(t, r))
			require.NoError(t, r.Validate(), "Validate alone does not look at the clock")
		})
	}
	r := validRequest()
	r.Hotel.CheckIn, r.Car.Pickup, r.Car.Return = "2028-05-30", "2028-05-30", "2028-05-31"
	require.Nil(t, invalid(t, r), "the last day of the horizon")
}

// Item 8: the car must share at least one day with the stay and last at
// least one day.
func TestValidateCarWithinTheStay(t *testing.T) {
	cases := map[string]struct {
		pickup, ret string
		want        map[string]string
	}{
		"a year after the stay":    {"2027-12-18", "2027-12-20", map[string]string{"car.pickup": "must be before the check-out: the rental must share at least one day with the stay (2026-12-18 to 2026-12-20)"}},
		"from the check-out day":   {"2026-12-20", "2026-12-22", map[string]string{"car.pickup": "must be before the check-out: the rental must share at least one day with the stay (2026-12-18 to 2026-12-20)"}},
		"returned at the check-in": {"2026-12-10", "2026-12-18", map[string]string{"car.return": "must be after the check-in: the rental must share at least one day with the stay (2026-12-18 to 2026-12-20)"}},
		"return equal to pickup":   {"2026-12-18", "2026-12-18", map[string]string{"car.return": "must be at least 1 day after car.pickup"}},
		"return before pickup":     {"2026-12-19", "2026-12-18", map[string]string{"car.return": "must be at least 1 day after car.pickup"}},
		"longer than 30 days":      {"2026-12-01", "2027-01-01", map[string]string{"car.return": "must be at most 30 days after car.pickup"}},
		"impossible date":          {"2026-02-30", "2026-12-20", map[string]string{"car.pickup": "must be a date YYYY-MM-DD"}},
		"not zero-padded":          {"2026-12-1", "2026-12-20", map[string]string{"car.pickup": "must be a date YYYY-MM-DD"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := validRequest()
			r.Car.Pickup, r.Car.Return = c.pickup, c.ret
			require.Equal(t, c.want, invalid(t, r))
		})
	}
	for _, ok := range [][2]string{{"2026-12-19", "2026-12-21"}, {"2026-12-17", "2026-12-19"}, {"2026-12-01", "2026-12-31"}} {
		r := validRequest()
		r.Car.Pickup, r.Car.Return = ok[0], ok[1]
		require.Nil(t, invalid(t, r), ok)
	}
}

// Item 9: ISO 4217 codes from golang.org/x/text/currency.
func TestValidateCurrency(t *testing.T) {
	for _, bad := range []string{"ZZZ", "usd", "XXX", "XTS", "XAU", "DEM", "US", "USDX", ""} {
		r := validRequest()
		r.Payment.Currency = bad
		require.Contains(t, invalid(t, r), "payment.currency", bad)
		require.False(t, IsCurrency(bad), bad)
	}
	for _, good := range []string{"USD", "EUR", "JPY", "GBP", "CHF", "VES", "MRU"} {
		require.True(t, IsCurrency(good), good)
	}
	require.Greater(t, len(Currencies()), 150)
}

// The supplement holds only codes x/text does not know: once it learns
// one, drop it from the supplement.
func TestCurrencySupplementStillNeeded(t *testing.T) {
	for _, c := range supplement {
		_, err := currency.ParseISO(c)
		require.Errorf(t, err, "golang.org/x/text/currency knows %s now: remove it from the supplement", c)
	}
}

// The contract lists exactly the accepted currencies.
func TestCurrenciesAreTheContractsList(t *testing.T) {
	b, err := os.ReadFile("../docs/contracts/trips-api.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "<!-- currencies: begin -->")
	require.True(t, ok)
	list, _, ok := strings.Cut(rest, "<!-- currencies: end -->")
	require.True(t, ok)
	require.Equal(t, Currencies(), strings.Fields(list), "docs/contracts/trips-api.md lists the accepted currencies")
}

// Item 10: lengths, control characters, emails.
func TestValidateText(t *testing.T) {
	cases := map[string]struct {
		mod   func(*TripRequest)
		field string
		want  string
	}{
		"60,000-character name":    {func(r *TripRequest) { r.Traveler.Name = strings.Repeat("a", 60000) }, "traveler.name", "must be at most 200 characters, not 60000"},
		"long name counts runes":   {func(r *TripRequest) { r.Traveler.Name = strings.Repeat("é", 201) }, "traveler.name", "must be at most 200 characters, not 201"},
		"60,000-char property id":  {func(r *TripRequest) { r.Hotel.PropertyID = strings.Repeat("P", 60000) }, "hotel.property_id", "must be at most 64 characters, not 60000"},
		"long car class":           {func(r *TripRequest) { r.Car.CarClass = strings.Repeat("c", 33) }, "car.car_class", "must be at most 32 characters, not 33"},
		"long card token":          {func(r *TripRequest) { r.Payment.CardToken = strings.Repeat("t", 129) }, "payment.card_token", "must be at most 128 characters, not 129"},
		"CR LF in the name":        {func(r *TripRequest) { r.Traveler.Name = "Ada\r\nBcc: x@example.com" }, "traveler.name", "must not contain control characters or line breaks (U+000D at character 4)"},
		"NUL in the name":          {func(r *TripRequest) { r.Traveler.Name = "Ada\x00" }, "traveler.name", "must not contain control characters or line breaks (U+0000 at character 4)"},
		"NEL (C1) in the name":     {func(r *TripRequest) { r.Traveler.Name = "Ada\u0085Lovelace" }, "traveler.name", "must not contain control characters or line breaks (U+0085 at character 4)"},
		"line separator":           {func(r *TripRequest) { r.Traveler.Name = "Ada\u2028Lovelace" }, "traveler.name", "must not contain control characters or line breaks (U+2028 at character 4)"},
		"paragraph separator":      {func(r *TripRequest) { r.Hotel.PropertyID = "P\u2029" }, "hotel.property_id", "must not contain control characters or line breaks (U+2029 at character 2)"},
		"tab in the car class":     {func(r *TripRequest) { r.Car.CarClass = "com\tpact" }, "car.car_class", "must not contain control characters or line breaks (U+0009 at character 4)"},
		"DEL in the card token":    {func(r *TripRequest) { r.Payment.CardToken = "tok\x7f" }, "payment.card_token", "must not contain control characters or line breaks (U+007F at character 4)"},
		"invalid UTF-8":            {func(r *TripRequest) { r.Traveler.Name = "Ada \xff" }, "traveler.name", "must be UTF-8 text"},
		"blank name":               {func(r *TripRequest) { r.Traveler.Name = "   " }, "traveler.name", "is required"},
		"no domain dot":            {func(r *TripRequest) { r.Traveler.Email = "a@b" }, "traveler.email", "must be an email address such as ada@example.com: the part after the @ must be a domain name such as example.com"},
		"300-octet local part":     {func(r *TripRequest) { r.Traveler.Email = strings.Repeat("a", 300) + "@example.com" }, "traveler.email", "must be at most 254 octets (RFC 5321), not 312"},
		"65-octet local part":      {func(r *TripRequest) { r.Traveler.Email = strings.Repeat("a", 65) + "@example.com" }, "traveler.email", "must have at most 64 octets before the @ (RFC 5321), not 65"},
		"display name":             {func(r *TripRequest) { r.Traveler.Email = "Ada <ada@example.com>" }, "traveler.email", "must be an email address such as ada@example.com (an addr-spec, RFC 5322 §3.4.1)"},
		"CRLF in the email":        {func(r *TripRequest) { r.Traveler.Email = "ada@example.com\r\nBcc: x@example.com" }, "traveler.email", "must be an email address such as ada@example.com, without control characters"},
		"numeric top-level domain": {func(r *TripRequest) { r.Traveler.Email = "ada@10.0.0.1" }, "traveler.email", "must be an email address such as ada@example.com: the part after the @ must be a domain name such as example.com"},
		"underscore in the domain": {func(r *TripRequest) { r.Traveler.Email = "ada@ex_ample.com" }, "traveler.email", "must be an email address such as ada@example.com: the part after the @ must be a domain name such as example.com"},
		"64-octet domain label":    {func(r *TripRequest) { r.Traveler.Email = "ada@" + strings.Repeat("x", 64) + ".com" }, "traveler.email", "must be an email address such as ada@example.com: the part after the @ must be a domain name such as example.com"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := validRequest()
			c.mod(&r)
			require.Equal(t, map[string]string{c.field: c.want}, invalid(t, r))
		})
	}
	r := validRequest()
	r.Traveler.Email = strings.Repeat("a", 64) + "@" + strings.Repeat("d", 63) + "." + strings.Repeat("e", 63) + "." + strings.Repeat("f", 57) + ".com"
	require.Len(t, r.Traveler.Email, 254)
	require.Nil(t, invalid(t, r), "at the limits of RFC 5321")
	r.Traveler.Name = strings.Repeat("é", 200)
	require.Nil(t, invalid(t, r), "200 characters, 400 octets")
}

// Item 12: ranges are said.
func TestValidateRanges(t *testing.T) {
	r := validRequest()
	r.Hotel.Nights = 0
	r.Payment.AmountCents = MaxAmountCents + 1
	require.Equal(t, map[string]string{
		"hotel.nights":         "must be an integer from 1 to 30",
		"payment.amount_cents": "must be an integer from 1 to 100000000000 (minor units of the currency)",
	}, invalid(t, r))
	r = validRequest()
	r.Hotel.Nights, r.Car.Return = 30, "2027-01-17"
	require.Nil(t, invalid(t, r))
}

func TestValidateEmptyRequestNamesEveryFieldInOrder(t *testing.T) {
	err := TripRequest{}.ValidateNew(now)
	var re *RequestError
	require.True(t, errors.As(err, &re))
	var got []string
	for _, f := range re.Fields {
		got = append(got, f.Field)
	}
	require.Equal(t, fieldOrder, got)
	require.Contains(t, err.Error(), "hotel.nights: must be an integer from 1 to 30")
}
