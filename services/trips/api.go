package trips

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/mail"
	"regexp"
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

// DecodeRequest reads and validates a POST /trips body. It returns every
// invalid field at once; a body that is not JSON of the right shape is one
// error naming where it broke.
func DecodeRequest(r io.Reader) (events.TripRequest, []FieldError) {
	var req events.TripRequest
	dec := json.NewDecoder(io.LimitReader(r, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te):
			f := te.Field
			return req, []FieldError{fe(f, fmt.Sprintf("must be a JSON %s", te.Type.Kind()))}
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return req, []FieldError{fe(name, "unknown field")}
		default:
			return req, []FieldError{{Field: "", Pointer: "#", Detail: "body is not a JSON trip request: " + err.Error()}}
		}
	}
	if dec.More() {
		return req, []FieldError{{Field: "", Pointer: "#", Detail: "body has data after the JSON object"}}
	}
	return req, Validate(req)
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
	if req.Payment.AmountCents <= 0 {
		errs = append(errs, fe("payment.amount_cents", "must be a positive integer (minor units)"))
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
