package trips

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/mail"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tripsaga/tripsaga/events"
)

// Prefer: wait bounds (trips-api.md).
const (
	WaitDefault = 10 * time.Second
	WaitMax     = 60 * time.Second
)

// FieldError names one invalid field of a request, for the "errors" member
// of an RFC 9457 problem.
type FieldError struct {
	Field   string `json:"field"`   // dotted path, e.g. "hotel.nights"
	Pointer string `json:"pointer"` // JSON Pointer (RFC 6901), e.g. "#/hotel/nights"
	Detail  string `json:"detail"`
}

// Problem is an RFC 9457 problem details object.
type Problem struct {
	Type     string       `json:"type"`
	Title    string       `json:"title"`
	Status   int          `json:"status"`
	Detail   string       `json:"detail,omitempty"`
	Instance string       `json:"instance,omitempty"`
	Errors   []FieldError `json:"errors,omitempty"`
}

func writeProblem(w http.ResponseWriter, p Problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

var (
	datePattern     = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)
	currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)
)

// MaxBodyBytes bounds a POST /trips body; a larger one is answered 413.
const MaxBodyBytes = 64 << 10

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

// DecodeRequest reads and validates a POST /trips body. It returns every
// invalid field at once, whether of the wrong JSON type, unknown, missing
// or out of range; a body that is not one JSON object is one error at "#".
func DecodeRequest(r io.Reader) (events.TripRequest, []FieldError) {
	var req events.TripRequest
	dec := json.NewDecoder(r)
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
				if !isNum || err != nil {
					errs = append(errs, fe(path, "must be a JSON integer"))
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
		Hotel:    events.HotelRequest{PropertyID: str("hotel.property_id"), CheckIn: str("hotel.check_in"), Nights: int(max(min(num("hotel.nights"), 1<<30), -1))},
		Car:      events.CarRequest{CarClass: str("car.car_class"), Pickup: str("car.pickup"), Return: str("car.return")},
		Payment:  events.PaymentRequest{CardToken: str("payment.card_token"), AmountCents: num("payment.amount_cents"), Currency: str("payment.currency")},
	}
	for _, e := range Validate(req) {
		if !bad[e.Field] {
			errs = append(errs, e)
		}
	}
	slices.SortFunc(errs, func(a, b FieldError) int { return strings.Compare(a.Field, b.Field) })
	return req, errs
}

func fe(field, detail string) FieldError {
	return FieldError{Field: field, Pointer: "#/" + strings.ReplaceAll(field, ".", "/"), Detail: detail}
}

// Validate returns every invalid field of req.
func Validate(req events.TripRequest) []FieldError {
	var errs []FieldError
	need := func(field, v string) {
		if strings.TrimSpace(v) == "" {
			errs = append(errs, fe(field, "is required"))
		}
	}
	date := func(field, v string) (time.Time, bool) {
		if v == "" {
			errs = append(errs, fe(field, "is required (YYYY-MM-DD)"))
			return time.Time{}, false
		}
		t, err := time.Parse(time.DateOnly, v)
		if !datePattern.MatchString(v) || err != nil {
			errs = append(errs, fe(field, "must be a date YYYY-MM-DD"))
			return time.Time{}, false
		}
		return t, true
	}
	need("traveler.name", req.Traveler.Name)
	if req.Traveler.Email == "" {
		errs = append(errs, fe("traveler.email", "is required"))
	} else if a, err := mail.ParseAddress(req.Traveler.Email); err != nil || a.Address != req.Traveler.Email {
		errs = append(errs, fe("traveler.email", "must be an email address"))
	}
	need("hotel.property_id", req.Hotel.PropertyID)
	date("hotel.check_in", req.Hotel.CheckIn)
	if req.Hotel.Nights < 1 || req.Hotel.Nights > 30 {
		errs = append(errs, fe("hotel.nights", "must be between 1 and 30"))
	}
	need("car.car_class", req.Car.CarClass)
	pickup, ok1 := date("car.pickup", req.Car.Pickup)
	ret, ok2 := date("car.return", req.Car.Return)
	if ok1 && ok2 && ret.Before(pickup) {
		errs = append(errs, fe("car.return", "must not be before car.pickup"))
	}
	need("payment.card_token", req.Payment.CardToken)
	if req.Payment.AmountCents <= 0 || req.Payment.AmountCents > 1e11 {
		errs = append(errs, fe("payment.amount_cents", "must be a positive integer of minor units, at most 100000000000"))
	}
	if !currencyPattern.MatchString(req.Payment.Currency) {
		errs = append(errs, fe("payment.currency", "must be an ISO 4217 code such as USD"))
	}
	return errs
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
