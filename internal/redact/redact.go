// Package redact masks the secrets and personal data tripsaga handles
// before they reach a log line, an error, a metric label or a dashboard:
// card tokens, travelers' email addresses, and the passwords inside
// connection URLs (DATABASE_URL, NATS_URL).
package redact

import (
	"bytes"
	"encoding/json"
	"net/url"
	"regexp"
	"strings"
)

// Mask is what stands for a hidden part.
const Mask = "***"

// Email masks an email address, keeping its first character and its
// domain: "ada@example.com" becomes "a***@example.com". A value without
// '@' is masked whole.
func Email(s string) string {
	local, domain, ok := strings.Cut(s, "@")
	if !ok || local == "" {
		return Mask
	}
	return local[:1] + Mask + "@" + domain
}

// Token masks a card token, keeping its last four characters when it has
// at least twelve ("tok_visa_4242424242" becomes "***4242"); a shorter
// token is masked whole. The simulators' fixed test tokens (tok_declined)
// are masked too: masking does not depend on what a token means.
func Token(s string) string {
	if len(s) >= 12 {
		return Mask + s[len(s)-4:]
	}
	return Mask
}

// Keys are the JSON member names whose string values [JSON] masks, and
// how: card tokens with [Token], email addresses with [Email].
var Keys = map[string]func(string) string{ //nolint:gochecknoglobals // read-only
	"card_token": Token,
	"email":      Email,
	"to":         Email, // the mail relay's recipient
}

// JSON returns data (a JSON document) with every string member named in
// [Keys], at any depth, masked. Data that is not JSON is returned as it
// is; callers show it as they would have before.
func JSON(data []byte) []byte {
	if len(data) == 0 {
		return data
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return data
	}
	if !walk(v) {
		return data
	}
	out, err := json.Marshal(v)
	if err != nil {
		return data
	}
	return out
}

// walk masks v in place and reports whether anything was masked.
func walk(v any) bool {
	changed := false
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if s, ok := val.(string); ok {
				if f := Keys[k]; f != nil {
					x[k] = f(s)
					changed = true
				}
				continue
			}
			if walk(val) {
				changed = true
			}
		}
	case []any:
		for _, e := range x {
			if walk(e) {
				changed = true
			}
		}
	}
	return changed
}

// emailRE finds email addresses in free text.
var emailRE = regexp.MustCompile(`[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}`)

// Text masks every email address in free text (an error message, a log
// line) with [Email].
func Text(s string) string {
	return emailRE.ReplaceAllStringFunc(s, Email)
}

// URL returns a connection URL with its password replaced by "xxxxx"
// (url.URL.Redacted), for logs and errors. A comma-separated list of URLs
// (NATS_URL of a cluster) is redacted URL by URL, and a keyword/value
// connection string (host=... password=...) has its password masked. A
// value that parses as neither is returned masked whole if it holds an
// '@' (it may hold a password), as it is otherwise.
func URL(s string) string {
	if strings.Contains(s, ",") && strings.Contains(s, "://") {
		parts := strings.Split(s, ",")
		for i, p := range parts {
			parts[i] = URL(strings.TrimSpace(p))
		}
		return strings.Join(parts, ",")
	}
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			if strings.Contains(s, "@") {
				return Mask
			}
			return s
		}
		if q := u.Query(); q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	if strings.Contains(s, "password=") {
		return kvPasswordRE.ReplaceAllString(s, "password=xxxxx")
	}
	return s
}

var kvPasswordRE = regexp.MustCompile(`password=('(?:[^'\\]|\\.)*'|\S*)`)
