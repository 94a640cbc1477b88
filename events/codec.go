package events

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/oklog/ulid/v2"
)

// Header names of the NATS protocol binding, binary content mode (CloudEvents
// spec, main branch, nats-protocol-binding.md §3.1): every attribute,
// extensions included, in its own "ce-<name>" header, datacontenttype as
// "ce-datacontenttype", values percent-encoded, data as the body.
const (
	headerPrefix      = "ce-"
	headerContentType = "Content-Type"
	structuredPrefix  = "application/cloudevents"
)

// New returns a CloudEvent of type typ from source about trip, with a fresh
// ULID id, the current time (UTC) and data marshalled as application/json.
func New(source, typ, trip string, data any) (event.Event, error) {
	e := event.New()
	e.SetID(ulid.Make().String())
	e.SetSource(source)
	e.SetType(typ)
	e.SetSubject(trip)
	e.SetTime(time.Now().UTC())
	if err := e.SetData(event.ApplicationJSON, data); err != nil {
		return e, fmt.Errorf("%w: data of %s: %w", ErrInvalidEvent, typ, err)
	}
	if err := e.Validate(); err != nil {
		return e, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	return e, nil
}

// Source returns the CloudEvents source of a service: "/tripsaga/<service>".
func Source(service string) string { return "/tripsaga/" + service }

// EncodeHeaders returns the binary-mode headers of e (without data).
func EncodeHeaders(e event.Event) (map[string]string, error) {
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	h := map[string]string{
		"ce-specversion": e.SpecVersion(),
		"ce-id":          e.ID(),
		"ce-source":      e.Source(),
		"ce-type":        e.Type(),
	}
	if v := e.Subject(); v != "" {
		h["ce-subject"] = v
	}
	if t := e.Time(); !t.IsZero() {
		h["ce-time"] = types.FormatTime(t)
	}
	if v := e.DataContentType(); v != "" {
		h["ce-datacontenttype"] = v
	}
	if v := e.DataSchema(); v != "" {
		h["ce-dataschema"] = v
	}
	for name, v := range e.Extensions() {
		s, err := types.Format(v)
		if err != nil {
			return nil, fmt.Errorf("%w: extension %s: %w", ErrInvalidEvent, name, err)
		}
		h[headerPrefix+name] = s
	}
	for k, v := range h {
		h[k] = percentEncode(v)
	}
	return h, nil
}

// Decode reads a CloudEvent from NATS message headers and body. A message
// whose Content-Type starts with "application/cloudevents" is structured
// mode (the whole event as JSON in the body); otherwise it must be binary
// mode. Errors wrap [ErrInvalidEvent].
func Decode(header map[string][]string, body []byte) (event.Event, error) {
	get := func(name string) string {
		if v := header[name]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	if ct := get(headerContentType); strings.HasPrefix(ct, structuredPrefix) {
		var e event.Event
		if err := json.Unmarshal(body, &e); err != nil {
			return e, fmt.Errorf("%w: structured mode: %w", ErrInvalidEvent, err)
		}
		for _, name := range []string{"data", "data_base64"} {
			if _, ok := e.Extensions()[name]; ok { // e.g. a member "dAtA", lower-cased by the SDK
				return e, fmt.Errorf("%w: structured mode: an extension may not be named %q", ErrInvalidEvent, name)
			}
		}
		if err := e.Validate(); err != nil {
			return e, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
		}
		return e, nil
	}
	attrs := map[string]string{}
	for k, vs := range header {
		lk := strings.ToLower(k)
		if !strings.HasPrefix(lk, headerPrefix) || len(vs) == 0 {
			continue
		}
		v, err := percentDecode(vs[0])
		if err != nil {
			return event.Event{}, fmt.Errorf("%w: header %s: %w", ErrInvalidEvent, k, err)
		}
		attrs[strings.TrimPrefix(lk, headerPrefix)] = v
	}
	if attrs["specversion"] == "" {
		return event.Event{}, fmt.Errorf("%w: no ce-specversion header", ErrInvalidEvent)
	}
	e := event.New(attrs["specversion"])
	if e.Context == nil {
		// An unknown version leaves no context: every setter would panic.
		return event.Event{}, fmt.Errorf("%w: ce-specversion %q is not %s or %s", ErrInvalidEvent,
			attrs["specversion"], event.CloudEventsVersionV1, event.CloudEventsVersionV03)
	}
	for name, v := range attrs {
		switch name {
		case "specversion":
		case "id":
			e.SetID(v)
		case "source":
			e.SetSource(v)
		case "type":
			e.SetType(v)
		case "subject":
			e.SetSubject(v)
		case "datacontenttype":
			e.SetDataContentType(v)
		case "dataschema":
			e.SetDataSchema(v)
		case "time":
			t, err := types.ParseTime(v)
			if err != nil {
				return e, fmt.Errorf("%w: ce-time: %w", ErrInvalidEvent, err)
			}
			e.SetTime(t)
		case "data", "data_base64":
			// Names the JSON event format reserves for the data (CloudEvents
			// JSON format, §3.1): an extension of that name could not be
			// written in structured mode.
			return e, fmt.Errorf("%w: ce-%s: an extension may not be named %q", ErrInvalidEvent, name, name)
		default:
			e.SetExtension(name, v)
		}
	}
	if len(body) > 0 {
		e.DataEncoded = append([]byte(nil), body...)
	}
	if err := e.Validate(); err != nil {
		return e, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	return e, nil
}

// DecodeData unmarshals the JSON data of e into v. Errors wrap
// [ErrInvalidEvent].
func DecodeData(e event.Event, v any) error {
	if ct := e.DataContentType(); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return fmt.Errorf("%w: datacontenttype %q is not application/json", ErrInvalidEvent, ct)
	}
	if err := json.Unmarshal(e.Data(), v); err != nil {
		return fmt.Errorf("%w: data of %s: %w", ErrInvalidEvent, e.Type(), err)
	}
	return nil
}

// percentEncode escapes space, '"', '%' and every byte outside printable
// ASCII as %XX of its UTF-8 bytes, as the binding requires for header values.
func percentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c > '~' || c == '"' || c == '%' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func percentDecode(s string) (string, error) {
	if !strings.Contains(s, "%") {
		if !utf8.ValidString(s) {
			return "", fmt.Errorf("not UTF-8")
		}
		return s, nil
	}
	var b []byte
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("truncated escape at %d", i)
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("bad escape %q", s[i:i+3])
		}
		b = append(b, hi<<4|lo)
		i += 2
	}
	if !utf8.Valid(b) {
		return "", fmt.Errorf("not UTF-8 after decoding")
	}
	return string(b), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
