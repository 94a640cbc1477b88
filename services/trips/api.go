package trips

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/process"
)

// Prefer: wait bounds (trips-api.md).
const (
	WaitDefault = 10 * time.Second
	WaitMax     = 60 * time.Second
)

// FieldError names one invalid field of a request (events.FieldError).
type FieldError = events.FieldError

// Problem is an RFC 9457 problem details object (process.Problem).
type Problem = process.Problem

func writeProblem(w http.ResponseWriter, p Problem) { process.WriteProblem(w, p) }

// Problem types of the trips API (trips-api.md).
const (
	problemInvalidRequest = "https://tripsaga.io/problems/invalid-trip-request"
	problemInvalidQuery   = "https://tripsaga.io/problems/invalid-query"
)

// MaxBodyBytes bounds a POST /trips body; a larger one is answered 413.
const MaxBodyBytes = 64 << 10

// MaxKeyChars bounds the Idempotency-Key header, in characters (Unicode
// code points).
const MaxKeyChars = 255

// leaf kinds of the request's fields.
const (
	kindString = "string"
	kindInt    = "int"
)

// requestShape lists every field of a trip request and its JSON kind.
var requestShape = map[string]map[string]string{ //nolint:gochecknoglobals // read-only table
	"traveler": {"name": kindString, "email": kindString},
	"hotel":    {"property_id": kindString, "check_in": kindString, "nights": kindInt},
	"car":      {"car_class": kindString, "pickup": kindString, "return": kindString},
	"payment":  {"card_token": kindString, "amount_cents": kindInt, "currency": kindString},
}

// intRange is the accepted range of each integer field, said in its error.
var intRange = map[string][2]int64{ //nolint:gochecknoglobals // read-only table
	"hotel.nights":         {events.MinNights, events.MaxNights},
	"payment.amount_cents": {events.MinAmountCents, events.MaxAmountCents},
}

// DecodeRequest reads a POST /trips body and validates it as a new
// booking made at now (events.TripRequest.ValidateNew). It returns every
// invalid field at once, whether of the wrong JSON type, unknown, missing
// or out of range; a body that is not UTF-8 (RFC 8259 §8.1), not one
// JSON object or larger than MaxBodyBytes (it reads no more) is one error
// at "#".
func DecodeRequest(r io.Reader, now time.Time) (events.TripRequest, []FieldError) {
	var req events.TripRequest
	raw, err := io.ReadAll(io.LimitReader(r, MaxBodyBytes+1))
	if err != nil {
		return req, []FieldError{{Field: "", Pointer: "#", Detail: "reading the body: " + err.Error()}}
	}
	if len(raw) > MaxBodyBytes {
		return req, []FieldError{{Field: "", Pointer: "#", Detail: fmt.Sprintf("body is larger than %d bytes", MaxBodyBytes)}}
	}
	if !utf8.Valid(raw) {
		return req, []FieldError{{Field: "", Pointer: "#", Detail: "body is not UTF-8 (RFC 8259 §8.1)"}}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return req, []FieldError{{Field: "", Pointer: "#", Detail: "body is not JSON: " + err.Error()}}
	}
	if _, err := dec.Token(); err != io.EOF {
		return req, []FieldError{{Field: "", Pointer: "#", Detail: "body has data after the JSON object"}}
	}
	top, ok := doc.(map[string]any)
	if !ok {
		return req, []FieldError{{Field: "", Pointer: "#", Detail: "body must be a JSON object"}}
	}
	if errs := strictJSON(raw); len(errs) > 0 {
		return req, errs
	}
	var errs []FieldError
	bad := map[string]bool{}
	values := map[string]any{}
	for name, v := range top {
		shape, known := requestShape[name]
		if !known {
			errs = append(errs, fe(name, "unknown field"))
			continue
		}
		obj, isObj := v.(map[string]any)
		if !isObj {
			errs = append(errs, fe(name, "must be a JSON object"))
			for leaf := range shape {
				bad[name+"."+leaf] = true
			}
			continue
		}
		for leaf, lv := range obj {
			path := name + "." + leaf
			kind, known := shape[leaf]
			if !known {
				errs = append(errs, fe(path, "unknown field"))
				continue
			}
			switch kind {
			case kindString:
				if sv, ok := lv.(string); ok {
					values[path] = sv
				} else {
					errs = append(errs, fe(path, "must be a JSON string"))
					bad[path] = true
				}
			case kindInt:
				n, isNum := lv.(json.Number)
				i, err := n.Int64()
				if rg := intRange[path]; !isNum || err != nil || i < rg[0] || i > rg[1] {
					errs = append(errs, fe(path, fmt.Sprintf("must be a JSON integer from %d to %d", rg[0], rg[1])))
					bad[path] = true
				} else {
					values[path] = i
				}
			}
		}
	}
	str := func(p string) string { v, _ := values[p].(string); return v }
	num := func(p string) int64 { v, _ := values[p].(int64); return v }
	req = events.TripRequest{
		Traveler: events.Person{Name: str("traveler.name"), Email: str("traveler.email")},
		Hotel:    events.HotelRequest{PropertyID: str("hotel.property_id"), CheckIn: str("hotel.check_in"), Nights: int(num("hotel.nights"))},
		Car:      events.CarRequest{CarClass: str("car.car_class"), Pickup: str("car.pickup"), Return: str("car.return")},
		Payment:  events.PaymentRequest{CardToken: str("payment.card_token"), AmountCents: num("payment.amount_cents"), Currency: str("payment.currency")},
	}
	var re *events.RequestError
	if errors.As(req.ValidateNew(now), &re) {
		for _, e := range re.Fields {
			if !bad[e.Field] {
				errs = append(errs, e)
			}
		}
	}
	slices.SortFunc(errs, func(a, b FieldError) int { return strings.Compare(a.Field, b.Field) })
	return req, errs
}

// fe returns the FieldError of a dotted field path. A top-level member
// named "" is named `""` (its pointer "#/"), so that no error about a
// member reads as one about the whole body (field "", pointer "#").
func fe(field, detail string) FieldError {
	if field == "" {
		return FieldError{Field: `""`, Pointer: "#/", Detail: detail}
	}
	return events.FieldErr(field, detail)
}

// CheckKey returns "" when key is a valid Idempotency-Key header value (or
// empty: no key), or what is wrong: not UTF-8, a control character, more
// than MaxKeyChars characters.
func CheckKey(key string) string {
	switch {
	case key == "":
		return ""
	case !utf8.ValidString(key):
		return "must be UTF-8 text"
	}
	if _, r, bad := events.FindControl(key); bad {
		return fmt.Sprintf("must not contain control characters (%U)", r)
	}
	if n := utf8.RuneCountInString(key); n > MaxKeyChars {
		return fmt.Sprintf("must be at most %d characters, not %d", MaxKeyChars, n)
	}
	return ""
}

// KeyOf returns the request's Idempotency-Key ("" when it has none) and
// "" or what is wrong with it: [CheckKey]'s, or given more than once. The
// header is one Item (draft-ietf-httpapi-idempotency-key-header, an sf
// string): two of them, or one with a comma-separated list, cannot say
// which key the client meant, so neither is taken.
func KeyOf(h http.Header) (key, detail string) {
	vs := h.Values("Idempotency-Key")
	if len(vs) > 1 {
		return "", fmt.Sprintf("given %d times: send it once", len(vs))
	}
	if len(vs) == 0 {
		return "", ""
	}
	return vs[0], CheckKey(vs[0])
}

// Fingerprint is the sha256 (hex) of the request's canonical JSON: the
// same trip asked twice has the same fingerprint whatever the key order or
// spacing of the body.
func Fingerprint(req events.TripRequest) string {
	b, _ := json.Marshal(req)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ParseWait reads "Prefer: wait=N" (RFC 7240 §4.3) and returns the wait,
// WaitDefault when absent or unreadable, at most WaitMax.
func ParseWait(h http.Header) (time.Duration, bool) {
	for _, v := range h.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			pref = strings.TrimSpace(strings.SplitN(pref, ";", 2)[0])
			name, val, ok := strings.Cut(pref, "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(val), `"`))
			if err != nil || n < 0 {
				continue
			}
			d := time.Duration(n) * time.Second
			if d > WaitMax {
				d = WaitMax
			}
			return d, true
		}
	}
	return WaitDefault, false
}
