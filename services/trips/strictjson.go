package trips

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
)

// strictJSON finds what encoding/json accepts silently in a body and this
// API refuses, naming the field of each: a member name given twice in one
// object (RFC 8259 §4 says names SHOULD be unique; the decoder keeps the
// last, so the booking would not be what the traveler checked) and a \u
// escape of a lone UTF-16 surrogate (RFC 8259 §8.2: not a character; the
// decoder turns it into U+FFFD). raw must be valid JSON; anything else is
// left to the decoder's own error.
func strictJSON(raw []byte) []FieldError {
	type frame struct {
		obj       bool
		expectKey bool
		keys      map[string]bool
		path      string
		key       string // the member being read
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	var stack []*frame
	var errs []FieldError
	child := func(f *frame, name string) string {
		if f.path == "" {
			return name
		}
		return f.path + "." + name
	}
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) || err != nil {
			return errs
		}
		end := dec.InputOffset()
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if s, ok := tok.(string); ok {
			field := "#"
			switch {
			case top != nil && top.obj && top.expectKey:
				field = child(top, s)
			case top != nil && top.obj:
				field = child(top, top.key)
			case top != nil:
				field = top.path
			}
			if loneSurrogate(raw[start:end]) {
				errs = append(errs, fe(field, "has a \\u escape of a lone UTF-16 surrogate, which is not a character (RFC 8259 §8.2)"))
			}
			if top != nil && top.obj && top.expectKey {
				if top.keys[s] {
					errs = append(errs, fe(child(top, s), "is given more than once (RFC 8259 §4: member names must be unique here)"))
				}
				top.keys[s] = true
				top.key = s
				top.expectKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			path := ""
			if top != nil {
				path = top.path
				if top.obj {
					path = child(top, top.key)
				}
			}
			stack = append(stack, &frame{obj: tok == json.Delim('{'), expectKey: true, keys: map[string]bool{}, path: path})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if len(stack) > 0 {
				top = stack[len(stack)-1]
			} else {
				top = nil
			}
		}
		if top != nil && top.obj {
			top.expectKey = true
		}
	}
}

// loneSurrogate reports whether the JSON string token tok (with its
// quotes) has a \u escape of a high surrogate not followed by one of a low
// surrogate, or of a low surrogate not preceded by a high one.
func loneSurrogate(tok []byte) bool {
	s := string(tok)
	high := false
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 >= len(s) {
			if high {
				return true
			}
			continue
		}
		if s[i+1] != 'u' || i+6 > len(s) {
			if high {
				return true
			}
			i++ // an escaped character, e.g. \\ or \"
			continue
		}
		v, err := strconv.ParseUint(s[i+2:i+6], 16, 32)
		if err != nil {
			return false // the decoder reports it
		}
		switch {
		case v >= 0xD800 && v <= 0xDBFF:
			if high {
				return true
			}
			high = true
		case v >= 0xDC00 && v <= 0xDFFF:
			if !high {
				return true
			}
			high = false
		default:
			if high {
				return true
			}
		}
		i += 5
	}
	return high
}
