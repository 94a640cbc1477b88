package events

import (
	"errors"
	"fmt"
	"net/mail"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/idna"
	"golang.org/x/text/currency"
)

// Limits of a trip request (trips-api.md, "Limits"). Lengths of text fields
// count characters (Unicode code points), except the email address, whose
// limits RFC 5321 sets in octets.
const (
	MaxNameChars       = 200 // traveler.name
	MaxPropertyIDChars = 64  // hotel.property_id
	MaxCarClassChars   = 32  // car.car_class
	MaxCardTokenChars  = 128 // payment.card_token

	// MaxEmailOctets is the longest address: RFC 5321 §4.5.3.1.3 limits a
	// path to 256 octets, angle brackets included.
	MaxEmailOctets = 254
	// MaxLocalPartOctets is the longest part before the "@" (RFC 5321
	// §4.5.3.1.1).
	MaxLocalPartOctets = 64

	MinNights, MaxNights         = 1, 30
	MinRentalDays, MaxRentalDays = 1, 30
	// MinAmountCents and MaxAmountCents bound payment.amount_cents, in
	// minor units of the currency.
	MinAmountCents, MaxAmountCents int64 = 1, 100_000_000_000
	// BookingHorizonMonths is how far ahead a check-in may be.
	BookingHorizonMonths = 18
)

// ErrInvalidRequest is wrapped by every [*RequestError].
var ErrInvalidRequest = errors.New("events: invalid trip request")

// FieldError names one invalid field of a request, for the "errors" member
// of an RFC 9457 problem.
type FieldError struct {
	Field   string `json:"field"`   // dotted path, e.g. "hotel.nights"
	Pointer string `json:"pointer"` // JSON Pointer (RFC 6901) as a URI fragment, e.g. "#/hotel/nights"
	Detail  string `json:"detail"`  // what is wrong, with the accepted range or form
}

// FieldErr returns the FieldError of a dotted field path ("hotel.nights",
// pointer "#/hotel/nights").
func FieldErr(field, detail string) FieldError {
	return FieldError{Field: field, Pointer: "#/" + strings.ReplaceAll(field, ".", "/"), Detail: detail}
}

// RequestError lists every invalid field of a trip request, in the order
// of the request's fields. It wraps [ErrInvalidRequest].
type RequestError struct {
	Fields []FieldError
}

// Error lists the fields: "events: invalid trip request: hotel.nights:
// must be an integer from 1 to 30; ...".
func (e *RequestError) Error() string {
	parts := make([]string, 0, len(e.Fields))
	for _, f := range e.Fields {
		parts = append(parts, f.Field+": "+f.Detail)
	}
	return ErrInvalidRequest.Error() + ": " + strings.Join(parts, "; ")
}

// Unwrap returns [ErrInvalidRequest].
func (e *RequestError) Unwrap() error { return ErrInvalidRequest }

// Validate checks everything about r that does not depend on the day it
// is asked: every field present; text fields valid UTF-8, free of control
// characters and line breaks (C0, DEL, C1, U+2028, U+2029) and within
// their limits; the email an RFC 5322 addr-spec within RFC 5321's limits
// whose domain is a DNS name (IDNA 2008, UTS #46) of two labels or more;
// dates YYYY-MM-DD; nights from MinNights to MaxNights; the car rental
// lasting MinRentalDays to MaxRentalDays and sharing at least one day with
// the stay (the days from check-in to check-out, check-out being check-in
// plus nights); the amount from MinAmountCents to MaxAmountCents; the
// currency one of [Currencies]. A step service can check a request it
// receives with it. It returns nil or a [*RequestError].
func (r TripRequest) Validate() error {
	v := &validator{}
	v.check(r)
	return v.err()
}

// ValidateNew is [TripRequest.Validate] plus the rules of a new booking
// made at now: the check-in and the car pickup today (now's date in UTC)
// or later, and the check-in at most BookingHorizonMonths months ahead.
// The trips API checks every POST /trips with it. It returns nil or a
// [*RequestError].
func (r TripRequest) ValidateNew(now time.Time) error {
	v := &validator{}
	v.check(r)
	y, m, d := now.UTC().Date()
	today := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	horizon := today.AddDate(0, BookingHorizonMonths, 0)
	if t, ok := v.dates["hotel.check_in"]; ok {
		switch {
		case t.Before(today):
			v.add("hotel.check_in", "must be today ("+today.Format(time.DateOnly)+", UTC) or later")
		case t.After(horizon):
			v.add("hotel.check_in", fmt.Sprintf("must be at most %d months ahead: on or before %s", BookingHorizonMonths, horizon.Format(time.DateOnly)))
		}
	}
	if t, ok := v.dates["car.pickup"]; ok && t.Before(today) {
		v.add("car.pickup", "must be today ("+today.Format(time.DateOnly)+", UTC) or later")
	}
	return v.err()
}

type validator struct {
	errs  []FieldError
	dates map[string]time.Time // the dates that parsed
}

func (v *validator) add(field, detail string) {
	// One error per field: the first found is the one to fix first.
	if !slices.ContainsFunc(v.errs, func(e FieldError) bool { return e.Field == field }) {
		v.errs = append(v.errs, FieldErr(field, detail))
	}
}

func (v *validator) err() error {
	if len(v.errs) == 0 {
		return nil
	}
	order := map[string]int{}
	for i, f := range fieldOrder {
		order[f] = i
	}
	slices.SortStableFunc(v.errs, func(a, b FieldError) int { return order[a.Field] - order[b.Field] })
	return &RequestError{Fields: v.errs}
}

// fieldOrder is the order of a trip request's fields, for stable errors.
var fieldOrder = []string{ //nolint:gochecknoglobals // read-only table
	"traveler.name", "traveler.email",
	"hotel.property_id", "hotel.check_in", "hotel.nights",
	"car.car_class", "car.pickup", "car.return",
	"payment.card_token", "payment.amount_cents", "payment.currency",
}

var datePattern = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)

func (v *validator) check(r TripRequest) {
	v.dates = map[string]time.Time{}
	v.text("traveler.name", r.Traveler.Name, MaxNameChars)
	if detail := CheckEmail(r.Traveler.Email); detail != "" {
		v.add("traveler.email", detail)
	}
	v.text("hotel.property_id", r.Hotel.PropertyID, MaxPropertyIDChars)
	checkIn, okIn := v.date("hotel.check_in", r.Hotel.CheckIn)
	okNights := r.Hotel.Nights >= MinNights && r.Hotel.Nights <= MaxNights
	if !okNights {
		v.add("hotel.nights", fmt.Sprintf("must be an integer from %d to %d", MinNights, MaxNights))
	}
	v.text("car.car_class", r.Car.CarClass, MaxCarClassChars)
	pickup, okP := v.date("car.pickup", r.Car.Pickup)
	ret, okR := v.date("car.return", r.Car.Return)
	if okP && okR {
		switch {
		case ret.Before(pickup.AddDate(0, 0, MinRentalDays)):
			v.add("car.return", fmt.Sprintf("must be at least %d day after car.pickup", MinRentalDays))
		case ret.After(pickup.AddDate(0, 0, MaxRentalDays)):
			v.add("car.return", fmt.Sprintf("must be at most %d days after car.pickup", MaxRentalDays))
		case okIn && okNights:
			checkOut := checkIn.AddDate(0, 0, r.Hotel.Nights)
			stay := fmt.Sprintf("the stay (%s to %s)", checkIn.Format(time.DateOnly), checkOut.Format(time.DateOnly))
			if !pickup.Before(checkOut) {
				v.add("car.pickup", "must be before the check-out: the rental must share at least one day with "+stay)
			} else if !ret.After(checkIn) {
				v.add("car.return", "must be after the check-in: the rental must share at least one day with "+stay)
			}
		}
	}
	v.text("payment.card_token", r.Payment.CardToken, MaxCardTokenChars)
	if r.Payment.AmountCents < MinAmountCents || r.Payment.AmountCents > MaxAmountCents {
		v.add("payment.amount_cents", fmt.Sprintf("must be an integer from %d to %d (minor units of the currency)", MinAmountCents, MaxAmountCents))
	}
	if !IsCurrency(r.Payment.Currency) {
		v.add("payment.currency", "must be an upper-case ISO 4217 code of a currency in use, e.g. USD or EUR (trips-api.md lists them)")
	}
}

// text checks a required free-text field of at most maxChars characters.
func (v *validator) text(field, s string, maxChars int) {
	if detail := CheckText(s, maxChars); detail != "" {
		v.add(field, detail)
	}
}

// date parses a required YYYY-MM-DD field and remembers it.
func (v *validator) date(field, s string) (time.Time, bool) {
	if s == "" {
		v.add(field, "is required (YYYY-MM-DD)")
		return time.Time{}, false
	}
	t, err := time.Parse(time.DateOnly, s)
	if !datePattern.MatchString(s) || err != nil {
		v.add(field, "must be a date YYYY-MM-DD")
		return time.Time{}, false
	}
	v.dates[field] = t
	return t, true
}

// CheckText returns "" when s is a valid required text field of at most
// maxChars characters (Unicode code points), or what is wrong: empty or
// only spaces, not UTF-8, a control character or line break, too long.
func CheckText(s string, maxChars int) string {
	if !utf8.ValidString(s) {
		return "must be UTF-8 text"
	}
	if strings.TrimSpace(s) == "" {
		return "is required"
	}
	if i, r, bad := FindControl(s); bad {
		return fmt.Sprintf("must not contain control characters or line breaks (%U at character %d)", r, utf8.RuneCountInString(s[:i])+1)
	}
	if n := utf8.RuneCountInString(s); n > maxChars {
		return fmt.Sprintf("must be at most %d characters, not %d", maxChars, n)
	}
	return ""
}

// FindControl returns the byte index and rune of the first control
// character or line break in s: C0 (U+0000 to U+001F, CR and LF among
// them), DEL, C1 (U+0080 to U+009F, NEL among them), U+2028 LINE SEPARATOR
// or U+2029 PARAGRAPH SEPARATOR, and whether there is one. A byte that is
// not UTF-8 is reported as U+FFFD.
func FindControl(s string) (int, rune, bool) {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if IsControl(r) || (r == utf8.RuneError && size == 1) {
			return i, r, true
		}
		i += size
	}
	return 0, 0, false
}

// IsInvisible reports whether r changes how the text around it is shown
// without being seen itself: the bidirectional embeddings, overrides and
// isolates (U+202A to U+202E, U+2066 to U+2069) and marks (U+200E,
// U+200F, U+061C), and the zero-width characters (U+200B to U+200D,
// U+2060, U+FEFF). They are Unicode's format characters (category Cf)
// of most use to a spoofer (Unicode Technical Report #36, "Bidirectional
// Text Spoofing"; CVE-2021-42574, "Trojan Source").
func IsInvisible(r rune) bool {
	switch {
	case r >= '\u202a' && r <= '\u202e', r >= '\u2066' && r <= '\u2069',
		r == '\u200e', r == '\u200f', r == '\u061c',
		r >= '\u200b' && r <= '\u200d', r == '\u2060', r == '\ufeff':
		return true
	}
	return false
}

// Visible returns s with each [IsInvisible] character written as
// "<U+202E>", so a name shown to a person (in a mail, on the console)
// cannot reorder or hide the text around it. The trip API accepts such
// names (trips-api.md sets no stricter rule than [FindControl]'s); they
// are escaped where they are shown, never changed where they are kept.
func Visible(s string) string {
	if !strings.ContainsFunc(s, IsInvisible) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if IsInvisible(r) {
			fmt.Fprintf(&b, "<%U>", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// IsControl reports whether r is a control character or a line break (see
// [FindControl]).
func IsControl(r rune) bool {
	return unicode.IsControl(r) || r == '\u2028' || r == '\u2029'
}

// emailDomain validates the domain of an address as a DNS name: IDNA 2008
// as UTS #46 maps it for lookup, labels of 1 to 63 octets, at most 253.
var emailDomain = idna.New(idna.MapForLookup(), idna.VerifyDNSLength(true), idna.BidiRule()) //nolint:gochecknoglobals // stateless

// CheckEmail returns "" when s is a deliverable-looking email address, or
// what is wrong. s must be exactly an addr-spec (RFC 5322 §3.4.1) whose
// local part is a dot-atom, as net/mail parses and gives it back (no
// quoted local part, display name, comment or angle brackets), at most
// MaxEmailOctets octets with a local part of at most MaxLocalPartOctets
// octets (RFC 5321 §4.5.3.1), without control characters, and its domain a
// DNS name of two labels or more ("a@b" is refused).
func CheckEmail(s string) string {
	const form = "must be an email address such as ada@example.com"
	switch {
	case s == "":
		return "is required"
	case !utf8.ValidString(s):
		return "must be UTF-8 text"
	case len(s) > MaxEmailOctets:
		return fmt.Sprintf("must be at most %d octets (RFC 5321), not %d", MaxEmailOctets, len(s))
	}
	if _, _, bad := FindControl(s); bad {
		return form + ", without control characters"
	}
	a, err := mail.ParseAddress(s)
	if err != nil || a.Name != "" || a.Address != s {
		return form + " (an addr-spec, RFC 5322 §3.4.1)"
	}
	at := strings.LastIndexByte(s, '@')
	local, domain := s[:at], s[at+1:]
	if len(local) > MaxLocalPartOctets {
		return fmt.Sprintf("must have at most %d octets before the @ (RFC 5321), not %d", MaxLocalPartOctets, len(local))
	}
	ascii, err := emailDomain.ToASCII(domain)
	labels := strings.Split(ascii, ".")
	if err != nil || len(labels) < 2 || strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return form + ": the part after the @ must be a domain name such as example.com"
	}
	return ""
}

// supplement lists ISO 4217 codes of currencies in use that
// golang.org/x/text/currency (CLDR 32 data) does not know yet, with the
// year ISO 4217 added them. A test fails once x/text knows one of them, so
// that it is dropped here.
var supplement = []string{ //nolint:gochecknoglobals // read-only table
	"MRU", // Mauritania, 2018
	"VES", // Venezuela, 2018
	"VED", // Venezuela, 2021
	"SLE", // Sierra Leone, 2022
	"ZWG", // Zimbabwe, 2024
	"XCG", // Curaçao and Sint Maarten, 2025
}

var currencies = func() []string { //nolint:gochecknoglobals // computed once, read-only
	set := map[string]bool{}
	for it := currency.Query(); it.Next(); {
		set[it.Unit().String()] = true
	}
	for _, c := range supplement {
		set[c] = true
	}
	out := make([]string, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}()

// Currencies returns the accepted payment currencies, sorted: the ISO 4217
// codes that golang.org/x/text/currency lists as legal tender in some
// region, plus the codes ISO 4217 added since its data (MRU, VES, VED,
// SLE, ZWG, XCG).
func Currencies() []string { return slices.Clone(currencies) }

// IsCurrency reports whether code is one of [Currencies] (upper case).
func IsCurrency(code string) bool {
	_, ok := slices.BinarySearch(currencies, code)
	return ok
}
