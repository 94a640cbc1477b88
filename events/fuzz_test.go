package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
)

// fuzzHeaders reads "name: value" lines (one header value each) into NATS
// headers.
func fuzzHeaders(lines string) map[string][]string {
	h := map[string][]string{}
	for line := range strings.SplitSeq(lines, "\n") {
		k, v, _ := strings.Cut(line, ": ")
		h[k] = append(h[k], v)
	}
	return h
}

// sameEvent reports what differs between two decoded events, or "".
func sameEvent(a, b event.Event) string {
	switch {
	case a.SpecVersion() != b.SpecVersion():
		return "specversion"
	case a.ID() != b.ID():
		return "id"
	case a.Source() != b.Source():
		return "source"
	case a.Type() != b.Type():
		return "type"
	case a.Subject() != b.Subject():
		return "subject"
	case !a.Time().Equal(b.Time()):
		return "time"
	case a.DataContentType() != b.DataContentType():
		return "datacontenttype"
	case a.DataSchema() != b.DataSchema():
		return "dataschema"
	case !maps.EqualFunc(a.Extensions(), b.Extensions(), func(x, y any) bool { return x == y }):
		return "extensions"
	case !bytes.Equal(a.Data(), b.Data()):
		return "data"
	}
	return ""
}

// FuzzDecode feeds arbitrary NATS headers and bodies to [Decode], in
// binary mode and, with a structured Content-Type, in structured mode:
// nothing may panic, every error wraps ErrInvalidEvent, and an event that
// decodes encodes again (the same mode) and decodes to the same event.
func FuzzDecode(f *testing.F) {
	good, err := New(Source("hotel"), HotelHeld, "T-1", StepData{TripID: "T-1", Step: "hotel", Reason: "ü"})
	if err != nil {
		f.Fatal(err)
	}
	good.SetExtension("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	h, err := EncodeHeaders(good)
	if err != nil {
		f.Fatal(err)
	}
	var lines []string
	for k, v := range h {
		lines = append(lines, k+": "+v)
	}
	binary := strings.Join(lines, "\n")
	structured, err := json.Marshal(good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add("", binary, good.Data())
	f.Add("", binary+"\nce-subject: Trip%20f%C3%BCr%20%E2%9C%88%2050%25", []byte(`{}`))
	f.Add("", binary+"\nCE-Time: 2026-11-30T13:09:00.123456789+01:00", []byte(nil))
	f.Add("", "ce-specversion: 1.0\nce-id: 1\nce-source: /x\nce-type: t\nce-subject: %", []byte(nil))
	f.Add("", "ce-specversion: 1.0\nce-id: 1\nce-source: /x\nce-type: t\nce-subject: %C3", []byte(nil))
	f.Add("", "ce-specversion: 1.0\nce-id: 1\nce-source: /x\nce-type: t\nce-time: yesterday", []byte(nil))
	f.Add("", "ce-specversion: 0.3\nce-id: 1\nce-source: /x\nce-type: t\nce-: x\nce-Ext_1: y", []byte("raw"))
	f.Add("", "ce-id: 1", []byte(nil))
	f.Add("application/cloudevents+json", "", structured)
	f.Add("application/cloudevents+json; charset=utf-8", "", []byte(`{"specversion":"1.0","id":"1","source":"/x","type":"t","data_base64":"AAEC"}`))
	f.Add("application/cloudevents+json", "", []byte(`{"specversion":"1.0","id":"1","source":"/x","type":"t","datacontenttype":"text/plain","data":"hi","ext":7}`))
	f.Add("application/cloudevents+json", "", []byte(`{"specversion":"9","id":1}`))
	f.Add("application/cloudevents", "", []byte(`[`))
	f.Fuzz(func(t *testing.T, contentType, headerLines string, body []byte) {
		header := fuzzHeaders(headerLines)
		if contentType != "" {
			header[headerContentType] = []string{contentType}
		}
		e, err := Decode(header, body)
		if err != nil {
			if !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("error does not wrap ErrInvalidEvent: %v", err)
			}
			return
		}
		var again event.Event
		if strings.HasPrefix(contentType, structuredPrefix) {
			b, err := json.Marshal(e)
			if err != nil {
				t.Fatalf("decoded event does not encode: %v", err)
			}
			if again, err = Decode(map[string][]string{headerContentType: {"application/cloudevents+json"}}, b); err != nil {
				t.Fatalf("re-encoded event %s does not decode: %v", b, err)
			}
		} else {
			h, err := EncodeHeaders(e)
			if err != nil {
				t.Fatalf("decoded event does not encode: %v", err)
			}
			nh := map[string][]string{}
			for k, v := range h {
				nh[k] = []string{v}
			}
			if again, err = Decode(nh, e.Data()); err != nil {
				t.Fatalf("re-encoded event %v does not decode: %v", h, err)
			}
		}
		if what := sameEvent(e, again); what != "" {
			t.Fatalf("%s differs after a round trip:\n%v\n%v", what, e, again)
		}
	})
}
