package asyncapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/tripsaga/tripsaga/events"
)

// docURL is the URL the document is known by while its schemas compile;
// nothing is fetched from it.
const docURL = "https://tripsaga.invalid/events/asyncapi.yaml"

// Validator checks NATS messages against the messages of an AsyncAPI
// document made by [Generate].
type Validator struct {
	messages map[string]*messageSchemas // by ce-type
}

type messageSchemas struct {
	address string // "<kind>.{trip}"
	headers *jsonschema.Schema
	payload *jsonschema.Schema
}

// ErrInvalid is wrapped by every error [Validator.Validate] returns.
var ErrInvalid = errors.New("asyncapi: message does not match the document")

// ParseDocument parses an AsyncAPI document (YAML) into the JSON value
// jsonschema compiles: objects, arrays, strings, json.Number, bools.
func ParseDocument(doc []byte) (any, error) {
	var v any
	if err := yaml.Unmarshal(doc, &v); err != nil {
		return nil, fmt.Errorf("asyncapi: YAML: %w", err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("asyncapi: to JSON: %w", err)
	}
	return jsonschema.UnmarshalJSON(bytes.NewReader(b))
}

// NewValidator compiles the headers and payload schema of every message
// of the document doc (YAML), as JSON Schema draft-07 (AsyncAPI's default
// schema format is its superset) with format assertions on (idn-email
// as events.CheckEmail), and finds each message's channel.
func NewValidator(doc []byte) (*Validator, error) {
	v, err := ParseDocument(doc)
	if err != nil {
		return nil, err
	}
	root, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("asyncapi: the document is not a mapping")
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.AssertFormat()
	// jsonschema has no idn-email (RFC 6531) check of its own: an address
	// passes when the trips API would accept it (events.CheckEmail).
	c.RegisterFormat(&jsonschema.Format{Name: "idn-email", Validate: func(v any) error {
		if s, ok := v.(string); ok {
			if detail := events.CheckEmail(s); detail != "" {
				return errors.New(detail)
			}
		}
		return nil
	}})
	if err := c.AddResource(docURL, v); err != nil {
		return nil, err
	}
	val := &Validator{messages: map[string]*messageSchemas{}}
	comps, _ := root["components"].(map[string]any)
	msgs, _ := comps["messages"].(map[string]any)
	if len(msgs) == 0 {
		return nil, errors.New("asyncapi: the document has no components.messages")
	}
	for typ := range msgs {
		m := &messageSchemas{}
		ptr := "#/components/messages/" + escapePointer(typ)
		if m.headers, err = c.Compile(docURL + ptr + "/headers"); err != nil {
			return nil, fmt.Errorf("asyncapi: headers of %s: %w", typ, err)
		}
		if m.payload, err = c.Compile(docURL + ptr + "/payload"); err != nil {
			return nil, fmt.Errorf("asyncapi: payload of %s: %w", typ, err)
		}
		val.messages[typ] = m
	}
	chans, _ := root["channels"].(map[string]any)
	for name, ch := range chans {
		ch, _ := ch.(map[string]any)
		address, _ := ch["address"].(string)
		cm, _ := ch["messages"].(map[string]any)
		for _, ref := range cm {
			r, _ := ref.(map[string]any)
			s, _ := r["$ref"].(string)
			typ, ok := strings.CutPrefix(s, "#/components/messages/")
			if m := val.messages[typ]; ok && m != nil {
				m.address = address
			}
		}
		if address == "" {
			return nil, fmt.Errorf("asyncapi: channel %s has no address", name)
		}
	}
	for typ, m := range val.messages {
		if m.address == "" {
			return nil, fmt.Errorf("asyncapi: message %s is on no channel", typ)
		}
	}
	return val, nil
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// Types returns the event types the document describes, sorted.
func (v *Validator) Types() []string { return sortedKeys(v.messages) }

// Validate checks one NATS message as the system publishes it: its
// ce-type is a message of the document; its headers match that message's
// headers schema; its subject is the channel's address with the trip
// (ce-subject) in it; Nats-Msg-Id is ce-id; its data matches the payload
// schema and names the same trip. Errors wrap [ErrInvalid] and say all
// that is wrong.
func (v *Validator) Validate(subject string, header map[string][]string, data []byte) error {
	first := func(name string) string {
		if vs := header[name]; len(vs) > 0 {
			return vs[0]
		}
		return ""
	}
	typ := first("ce-type")
	m, ok := v.messages[typ]
	if !ok {
		return fmt.Errorf("%w: ce-type %q is not a message of the document", ErrInvalid, typ)
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: "+format, append([]any{ErrInvalid, typ}, args...)...))
	}
	h := map[string]any{}
	for k, vs := range header {
		if len(vs) > 0 {
			h[k] = vs[0]
		}
	}
	if err := m.headers.Validate(h); err != nil {
		bad("headers: %v", err)
	}
	trip := first("ce-subject")
	if want := strings.Replace(m.address, "{trip}", trip, 1); subject != want {
		bad("NATS subject %q, want %q (channel %s)", subject, want, m.address)
	}
	if id := first("ce-id"); first("Nats-Msg-Id") != id {
		bad("Nats-Msg-Id %q is not ce-id %q", first("Nats-Msg-Id"), id)
	}
	if err := v.ValidateData(typ, data); err != nil {
		errs = append(errs, err)
	} else {
		var d struct {
			TripID string `json:"trip_id"`
		}
		if err := json.Unmarshal(data, &d); err != nil || d.TripID != trip {
			bad("data's trip_id %q is not ce-subject %q", d.TripID, trip)
		}
	}
	return errors.Join(errs...)
}

// ValidateData checks the data (JSON) of an event of type typ against the
// message's payload schema. Errors wrap [ErrInvalid].
func (v *Validator) ValidateData(typ string, data []byte) error {
	m, ok := v.messages[typ]
	if !ok {
		return fmt.Errorf("%w: ce-type %q is not a message of the document", ErrInvalid, typ)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%w: %s: data is not JSON: %w", ErrInvalid, typ, err)
	}
	if err := m.payload.Validate(inst); err != nil {
		return fmt.Errorf("%w: %s: data: %w", ErrInvalid, typ, err)
	}
	return nil
}

// Has reports whether typ is a message of the document.
func (v *Validator) Has(typ string) bool {
	_, ok := v.messages[typ]
	return ok
}
