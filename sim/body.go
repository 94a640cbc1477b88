package sim

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// maxBodyBytes bounds a request body: 1 MiB.
const maxBodyBytes = 1 << 20

// answer is one HTTP answer: a status code and its body, byte for byte.
type answer struct {
	status int
	body   []byte
}

func jsonAnswer(status int, v any) answer {
	b, err := json.Marshal(v)
	if err != nil {
		// Only maps of JSON-decoded values and strings are marshaled here.
		panic(fmt.Sprintf("sim: marshal answer: %v", err))
	}
	return answer{status: status, body: b}
}

func errorAnswer(status int, msg string) answer {
	return jsonAnswer(status, map[string]string{"error": msg})
}

var noneAnswer = jsonAnswer(http.StatusOK, map[string]string{"status": "none"}) //nolint:gochecknoglobals // read-only

func writeAnswer(w http.ResponseWriter, a answer) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeAnswer(w, jsonAnswer(status, v))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeAnswer(w, errorAnswer(status, msg))
}

// decodeObject decodes b as one JSON object, keeping numbers as json.Number.
func decodeObject(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if m == nil {
		return nil, errors.New("want a JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the JSON object")
	}
	return m, nil
}

// readBody reads the request body as a JSON object and returns it with its
// canonical form (object keys sorted, no insignificant space, numbers as
// written) and the fingerprint: hex sha256 of the canonical form.
func readBody(w http.ResponseWriter, r *http.Request) (req map[string]any, canonical []byte, fingerprint string, err error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		return nil, nil, "", fmt.Errorf("body: %w", err)
	}
	req, err = decodeObject(b)
	if err != nil {
		return nil, nil, "", fmt.Errorf("body: %w", err)
	}
	canonical, err = json.Marshal(req)
	if err != nil {
		return nil, nil, "", fmt.Errorf("body: %w", err)
	}
	sum := sha256.Sum256(canonical)
	return req, canonical, hex.EncodeToString(sum[:]), nil
}

// lookup follows a dotted path ("driver.email") into a decoded object.
func lookup(m map[string]any, path string) (any, bool) {
	var cur any = m
	for part := range strings.SplitSeq(path, ".") {
		obj, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		cur, ok = obj[part]
		if !ok {
			return nil, false
		}
	}
	return cur, true
}

// matchString renders a decoded JSON value for fault matching: a string as
// itself, anything else as its compact JSON text (42, true, null).
func matchString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

// str returns the string at path, or "" when absent or not a string.
func str(m map[string]any, path string) string {
	v, _ := lookup(m, path)
	s, _ := v.(string)
	return s
}

// integer returns the integer at path, or 0.
func integer(m map[string]any, path string) int64 {
	v, _ := lookup(m, path)
	n, _ := v.(json.Number)
	i, _ := strconv.ParseInt(n.String(), 10, 64)
	return i
}

// validator collects field errors of a request body.
type validator struct {
	m    map[string]any
	errs []string
}

func (v *validator) fail(path, format string, args ...any) {
	v.errs = append(v.errs, path+": "+fmt.Sprintf(format, args...))
}

func (v *validator) err() error {
	if len(v.errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(v.errs, "; "))
}

// str requires a non-empty string at path.
func (v *validator) str(path string) string {
	raw, ok := lookup(v.m, path)
	if !ok || raw == nil {
		v.fail(path, "required")
		return ""
	}
	s, isStr := raw.(string)
	if !isStr {
		v.fail(path, "want a string")
		return ""
	}
	if strings.TrimSpace(s) == "" {
		v.fail(path, "must not be empty")
	}
	return s
}

// email requires a string of the form local@domain at path.
func (v *validator) email(path string) {
	before := len(v.errs)
	s := v.str(path)
	if len(v.errs) > before {
		return
	}
	at := strings.LastIndexByte(s, '@')
	if at <= 0 || at == len(s)-1 || strings.ContainsAny(s, " \t\r\n") {
		v.fail(path, "want an email address (the value is not repeated: it is personal data)")
	}
}

// date requires a YYYY-MM-DD calendar date at path.
func (v *validator) date(path string) (time.Time, bool) {
	before := len(v.errs)
	s := v.str(path)
	if len(v.errs) > before {
		return time.Time{}, false
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		v.fail(path, "want a date YYYY-MM-DD, got %q", s)
		return time.Time{}, false
	}
	return t, true
}

// dateRange requires dates YYYY-MM-DD at from and to, to not before from
// (a car's pickup and return, a policy's start and end).
func (v *validator) dateRange(from, to string) {
	start, okFrom := v.date(from)
	end, okTo := v.date(to)
	if okFrom && okTo && end.Before(start) {
		v.fail(to, "must not be before %s", from)
	}
}

// positiveInt requires an integer of at least 1 at path.
func (v *validator) positiveInt(path string) {
	raw, ok := lookup(v.m, path)
	if !ok || raw == nil {
		v.fail(path, "required")
		return
	}
	n, isNum := raw.(json.Number)
	if !isNum {
		v.fail(path, "want an integer")
		return
	}
	i, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		v.fail(path, "want an integer, got %s", n)
		return
	}
	if i < 1 {
		v.fail(path, "must be at least 1, got %d", i)
	}
}

var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

// currency requires an ISO 4217 code (three uppercase letters) at path.
func (v *validator) currency(path string) {
	before := len(v.errs)
	s := v.str(path)
	if len(v.errs) > before {
		return
	}
	if !currencyRE.MatchString(s) {
		v.fail(path, "want an ISO 4217 code of three uppercase letters, got %q", s)
	}
}

// newID returns prefix followed by 16 random hex digits, e.g. H-9f86d081884c7d65.
func newID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return prefix + hex.EncodeToString(b[:])
}
