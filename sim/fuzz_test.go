package sim

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzReadBody feeds arbitrary bytes to the simulators' request parser
// (readBody, decodeObject) and every company's validator: nothing may
// panic, a body over maxBodyBytes is refused, and an accepted body's
// canonical form decodes again to the same canonical form.
func FuzzReadBody(f *testing.F) {
	for _, s := range []string{
		`{"trip_id":"T-1","property_id":"P-100","check_in":"2026-07-01","nights":2,"guest":{"name":"Ada","email":"ada@example.com"}}`,
		`{"trip_id":"T-1","amount_cents":33000,"currency":"USD","card_token":"tok_visa_ok"}`,
		`{"trip_id":"T-1","car_class":"compact","pickup":"2026-07-01","return":"2026-06-30","driver":{"name":"Ada","email":"ada@"}}`,
		`{"to":"ada@example.com","subject":"Trip","text":"hi","trip_id":"T-1"}`,
		`{"nights":1e400,"amount_cents":-1,"currency":"usd","guest":"x","check_in":"2026-02-30"}`,
		`{"a":1} {"b":2}`, `[1,2]`, `null`, `"x"`, `{`, ``, `{"a":"\ud800"}`, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/holds", bytes.NewReader(body))
		req, canonical, fp, err := readBody(httptest.NewRecorder(), r)
		if len(body) > maxBodyBytes && err == nil {
			t.Fatalf("accepted a body of %d bytes", len(body))
		}
		if err != nil {
			if req != nil || canonical != nil || fp != "" {
				t.Fatalf("error %v with a result", err)
			}
			return
		}
		again, err := decodeObject(canonical)
		if err != nil {
			t.Fatalf("canonical form %s does not decode: %v", canonical, err)
		}
		if c2 := jsonAnswer(200, again).body; !bytes.Equal(c2, canonical) {
			t.Fatalf("canonical form not stable: %s then %s", canonical, c2)
		}
		for _, sp := range specs() {
			v := &validator{m: req}
			sp.validate(v)
			if err := v.err(); err != nil {
				for _, e := range v.errs {
					if field, _, ok := strings.Cut(e, ": "); !ok || field == "" {
						t.Fatalf("%s: error %q names no field", sp.name, e)
					}
				}
				_ = errorAnswer(http.StatusUnprocessableEntity, err.Error())
			}
			_ = matchString(req)
			_ = str(req, "guest.email")
			_ = integer(req, "amount_cents")
		}
	})
}
