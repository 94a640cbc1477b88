package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// answerTransport answers every request with one status and body, without
// a network.
type answerTransport struct {
	status int
	body   []byte
}

func (a answerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: a.status, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(bytes.NewReader(a.body)), Request: r}, nil
}

// answerCarries reports whether body is one JSON object whose "key" is key
// and whose echo fields have want's values.
func answerCarries(body []byte, key string, want map[string]any) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if dec.Decode(&m) != nil {
		return false
	}
	if k, ok := m["key"].(string); !ok || k != key {
		return false
	}
	for f, w := range want {
		if jsonText(m[f]) != jsonText(w) {
			return false
		}
	}
	return true
}

// FuzzAnswer feeds arbitrary status codes and bodies to a company client
// (the card processor's: with an echo of amount and currency) through
// Create, Undo and StatusFor: nothing may panic, and no call reports
// success (Done, Undone) for an answer that does not carry the key sent
// (and, for a charge, its amount and currency).
func FuzzAnswer(f *testing.F) {
	const key = "trip-1:payment:charge"
	for _, s := range []struct {
		status int
		body   string
	}{
		{201, `{"key":"trip-1:payment:charge","charge_id":"C-1","status":"charged","amount_cents":33000,"currency":"USD"}`},
		{201, `{"key":"trip-2:payment:charge","charge_id":"C-1","status":"charged","amount_cents":33000,"currency":"USD"}`},
		{201, `{"key":"trip-1:payment:charge","charge_id":"C-1","status":"charged","amount_cents":3300,"currency":"USD"}`},
		{201, `{"key":"trip-1:payment:charge","charge_id":"C-1","status":"charged","amount_cents":"33000","currency":"USD"}`},
		{200, `{"charge_id":"C-1","status":"charged","amount_cents":33000,"currency":"USD"}`},
		{200, `{"key":"trip-1:payment:charge","status":"refunded"}`},
		{200, `{"key":"trip-1:payment:charge","status":"refunded"} {"key":"x"}`},
		{200, `{"status":"none"}`},
		{404, `{"status":"none"}`},
		{402, `{"reason":"insufficient funds"}`},
		{409, ``}, {422, `{"error":"card closed"}`}, {401, `{}`}, {429, ``}, {503, `busy`},
		{200, ``}, {200, `null`}, {200, `[]`}, {200, `{"key":1}`}, {-1, `{}`}, {1000, `{}`},
	} {
		f.Add(s.status, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		c := &Client{Company: "payments", BaseURL: "http://payments.invalid", Resource: "charges", IDField: "charge_id",
			UndoVerb: "refund", ActiveStatus: "charged", UndoneStatus: "refunded",
			Statuses: []string{"charged", "refunded", "declined"}, Echo: []string{"amount_cents", "currency"},
			HTTP: &http.Client{Transport: answerTransport{status: status, body: body}}}
		req := map[string]any{"trip_id": "trip-1", "amount_cents": 33000, "currency": "USD", "card_token": "tok_visa_ok"}
		echo := map[string]any{"amount_cents": 33000, "currency": "USD"}
		ctx := context.Background()
		check := func(op string, res Result, err error, want map[string]any) {
			if err != nil {
				if !errors.Is(err, ErrUnknownOutcome) {
					var refused *RefusedError
					if !errors.As(err, &refused) && !strings.Contains(err.Error(), "provider:") {
						t.Fatalf("%s: error neither unknown nor refused: %v", op, err)
					}
				}
				return
			}
			if (res.Outcome == Done || res.Outcome == Undone) && !answerCarries(body, key, want) {
				t.Fatalf("%s: %v for a %d answer that does not carry the key sent: %q", op, res.Outcome, status, body)
			}
		}
		res, err := c.Create(ctx, key, req)
		check("create", res, err, echo)
		res, err = c.Undo(ctx, key)
		check("undo", res, err, nil)
		res, err = c.StatusFor(ctx, key, req)
		check("status", res, err, echo)
	})
}
