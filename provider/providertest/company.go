package providertest

import (
	"net/http"
	"strings"
)

// company describes one company of the contract: its resource, its answers
// and the request bodies the suite sends it.
type company struct {
	base       string // base URL without a trailing slash
	step       string // key suffix: "hotel" makes keys "T-…:hotel"
	collection string // holds
	idField    string // hold_id
	created    string // status after a create: held
	createCode int    // 201, or 202 for mail
	undoVerb   string // release; empty: no undo (mail)
	undone     string // status after an undo: released
	// faultOp and businessFault: the fault rule that refuses a create
	// ("hold", "sold_out"); empty when the company has none.
	faultOp       string
	businessFault string
	refusedCode   int // 409 or 402
	// body returns a valid create body for trip; variant 1 differs from
	// variant 0 in one business field.
	body func(trip string, variant int) map[string]any
	// cardToken returns the card token used for trip (card processor only).
	cardToken func(trip string) string
}

func hotel(base string) company {
	return company{
		base: strings.TrimRight(base, "/"), step: "hotel",
		collection: "holds", idField: "hold_id", created: "held", createCode: http.StatusCreated,
		undoVerb: "release", undone: "released",
		faultOp: "hold", businessFault: "sold_out", refusedCode: http.StatusConflict,
		body: func(trip string, variant int) map[string]any {
			return map[string]any{
				"trip_id":     trip,
				"property_id": "P-contract",
				"check_in":    "2031-05-01",
				"nights":      2 + variant,
				"guest":       map[string]any{"name": "Ada Contract", "email": "ada@example.com"},
			}
		},
	}
}

func payments(base, cardToken string) company {
	token := func(trip string) string {
		if cardToken != "" {
			return cardToken
		}
		return "tok_ct_" + trip
	}
	return company{
		base: strings.TrimRight(base, "/"), step: "charge",
		collection: "charges", idField: "charge_id", created: "charged", createCode: http.StatusCreated,
		undoVerb: "refund", undone: "refunded",
		faultOp: "charge", businessFault: "declined", refusedCode: http.StatusPaymentRequired,
		body: func(trip string, variant int) map[string]any {
			return map[string]any{
				"trip_id":      trip,
				"amount_cents": 12345 + variant,
				"currency":     "EUR",
				"card_token":   token(trip),
			}
		},
		cardToken: token,
	}
}

func cars(base string) company {
	return company{
		base: strings.TrimRight(base, "/"), step: "car",
		collection: "bookings", idField: "booking_id", created: "booked", createCode: http.StatusCreated,
		undoVerb: "cancel", undone: "canceled",
		faultOp: "book", businessFault: "sold_out", refusedCode: http.StatusConflict,
		body: func(trip string, variant int) map[string]any {
			class := "compact"
			if variant != 0 {
				class = "suv"
			}
			return map[string]any{
				"trip_id":   trip,
				"car_class": class,
				"pickup":    "2031-05-01",
				"return":    "2031-05-03",
				"driver":    map[string]any{"name": "Ada Contract", "email": "ada@example.com"},
			}
		},
	}
}

func insurer(base string) company {
	return company{base: strings.TrimRight(base, "/"), step: "insurance", collection: "policies", idField: "policy_id",
		created: "active", createCode: http.StatusCreated, undoVerb: "cancel", undone: "canceled",
		faultOp: "insure", businessFault: "rejected", refusedCode: http.StatusConflict, body: policyBody}
}

// policyBody is a POST /policies body (providers.md, Travel insurer);
// variant 1 insures another trip cost.
func policyBody(trip string, variant int) map[string]any {
	return map[string]any{
		"traveler":        map[string]any{"name": "Ada Contract", "email": "ada@example.com"},
		"trip_id":         trip,
		"start":           "2031-05-01",
		"end":             "2031-05-03",
		"trip_cost_cents": 33000 + variant,
		"currency":        "EUR",
	}
}

func mail(base string) company {
	return company{
		base: strings.TrimRight(base, "/"), step: "mail:confirmed",
		collection: "messages", idField: "message_id", created: "queued", createCode: http.StatusAccepted,
		body: func(trip string, variant int) map[string]any {
			subject := "Trip " + trip + " confirmed"
			if variant != 0 {
				subject = "Trip " + trip + " canceled"
			}
			return map[string]any{
				"to":      "ada@example.com",
				"subject": subject,
				"text":    "Bon voyage.",
				"trip_id": trip,
			}
		},
	}
}
