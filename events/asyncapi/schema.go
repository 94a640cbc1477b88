package asyncapi

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/invopop/jsonschema"

	"github.com/tripsaga/tripsaga/events"
)

// Patterns of the identifiers the system makes. A ULID is 26 characters of
// Crockford's base 32, upper case (github.com/oklog/ulid/v2's String); a
// trip id is "T-" and a ULID (the trips API makes it).
const (
	ulidPattern = `[0-9A-HJKMNP-TV-Z]{26}`
	// ULIDPattern matches a ULID, the id of every event.
	ULIDPattern = `^` + ulidPattern + `$`
	// TripIDPattern matches a trip id.
	TripIDPattern = `^T-` + ulidPattern + `$`
	// keyPattern matches an Idempotency-Key of a step's company call:
	// "<trip id>:<key name>", e.g. "T-...:charge" or "T-...:mail:confirmed".
	keyPattern = `^T-` + ulidPattern + `:[a-z_]+(:[a-z_]+)*$`
	// textPattern refuses what events.CheckText refuses in a text field:
	// C0 controls (line breaks among them), DEL, C1 controls, U+2028 and
	// U+2029.
	textPattern = "^[^\\x00-\\x1F\\x7F-\\x9F\u2028\u2029]*$"
)

// field documents and constrains one property of a data type ("" for the
// type itself). Every type and property of the event data must have one:
// the generator refuses a field it cannot describe, so a new field is
// described here before the document can be made.
type field struct {
	desc  string
	apply func(*jsonschema.Schema)
}

func text(maxChars int) func(*jsonschema.Schema) {
	return func(s *jsonschema.Schema) {
		s.MinLength = ptr(uint64(1))
		s.MaxLength = ptr(uint64(maxChars))
		s.Pattern = textPattern
	}
}

func pattern(p string) func(*jsonschema.Schema) {
	return func(s *jsonschema.Schema) { s.Pattern = p }
}

func format(f string) func(*jsonschema.Schema) {
	return func(s *jsonschema.Schema) { s.Format = f }
}

func nonEmpty(s *jsonschema.Schema) { s.MinLength = ptr(uint64(1)) }

func between(lo, hi int64) func(*jsonschema.Schema) {
	return func(s *jsonschema.Schema) {
		s.Minimum = json.Number(strconv.FormatInt(lo, 10))
		s.Maximum = json.Number(strconv.FormatInt(hi, 10))
	}
}

func ptr[T any](v T) *T { return &v }

// fields describes the data types of package events, by Go type name and
// JSON name. The limits are the events package's own (request.go), so
// the schema says what a trip request that the trips API accepted is.
var fields = map[string]map[string]field{ //nolint:gochecknoglobals // read-only table
	"Person": {
		"":     {desc: "The traveler: the guest of the hotel, the driver of the car and the addressee of the mail.", apply: nil},
		"name": {desc: fmt.Sprintf("Full name: 1 to %d characters, no control characters or line breaks.", events.MaxNameChars), apply: text(events.MaxNameChars)},
		"email": {desc: fmt.Sprintf("Email address (RFC 5322 addr-spec, dot-atom local part; the domain may be internationalized), at most %d octets.", events.MaxEmailOctets), apply: func(s *jsonschema.Schema) {
			s.Format = "idn-email"
			s.MinLength = ptr(uint64(3))
			s.MaxLength = ptr(uint64(events.MaxEmailOctets))
		}},
	},
	"HotelRequest": {
		"":            {desc: "The room part of the trip."},
		"property_id": {desc: fmt.Sprintf("The hotel's id of the property: 1 to %d characters.", events.MaxPropertyIDChars), apply: text(events.MaxPropertyIDChars)},
		"check_in":    {desc: "Check-in day, YYYY-MM-DD.", apply: format("date")},
		"nights":      {desc: fmt.Sprintf("Nights from the check-in: %d to %d.", events.MinNights, events.MaxNights), apply: between(events.MinNights, events.MaxNights)},
	},
	"CarRequest": {
		"":          {desc: "The car part of the trip; the rental shares at least one day with the stay."},
		"car_class": {desc: fmt.Sprintf("The car firm's class: 1 to %d characters.", events.MaxCarClassChars), apply: text(events.MaxCarClassChars)},
		"pickup":    {desc: "Pickup day, YYYY-MM-DD.", apply: format("date")},
		"return":    {desc: fmt.Sprintf("Return day, YYYY-MM-DD: %d to %d days after the pickup.", events.MinRentalDays, events.MaxRentalDays), apply: format("date")},
	},
	"PaymentRequest": {
		"":             {desc: "The card part of the trip."},
		"card_token":   {desc: fmt.Sprintf("The card processor's token of the card (never a card number): 1 to %d characters.", events.MaxCardTokenChars), apply: text(events.MaxCardTokenChars)},
		"amount_cents": {desc: "The price of the whole trip in minor units of the currency (an integer: 33000 is 330.00 USD).", apply: between(events.MinAmountCents, events.MaxAmountCents)},
		"currency":     {desc: "ISO 4217 code of a currency in use, upper case (docs/contracts/trips-api.md lists them).", apply: pattern(`^[A-Z]{3}$`)},
	},
	"TripRequest": {
		"":         {desc: "A trip as the traveler asked for it (the body of POST /trips, docs/contracts/trips-api.md), as the trips API accepted it."},
		"traveler": {desc: "Who travels."},
		"hotel":    {desc: "The room."},
		"car":      {desc: "The car."},
		"payment":  {desc: "The card and the price."},
	},
	"TripRequestedData": {
		"":        {desc: "Data of io.tripsaga.trip.requested.v1: a traveler asked for a trip."},
		"trip_id": {desc: "The trip: \"T-\" and a ULID, the event's ce-subject.", apply: pattern(TripIDPattern)},
		"request": {desc: "The trip request."},
	},
	"StepData": {
		"":                {desc: "Data of every step event (held, rejected, failed, released, charged, declined, refunded, booked, sent). Events that start the next step carry the trip request."},
		"trip_id":         {desc: "The trip: \"T-\" and a ULID, the event's ce-subject.", apply: pattern(TripIDPattern)},
		"step":            {desc: "The saga step the event is about (the catalogue's step name).", apply: nonEmpty},
		"idempotency_key": {desc: "The Idempotency-Key of the step's company call: the trip id, a colon and the step's key name (T-...:hotel, T-...:charge, T-...:car, T-...:mail:confirmed).", apply: pattern(keyPattern)},
		"company_ref":     {desc: "The company's reference of what it did (hold_id, charge_id, booking_id, message_id); absent when the company did nothing or did not say.", apply: nonEmpty},
		"reason":          {desc: "Why the step was rejected, failed or undone, in words, when there is a reason to give.", apply: nonEmpty},
		"request": {desc: "The trip request, carried by the events that start the next step.", apply: func(s *jsonschema.Schema) {
			// The Go field is JSON the saga machinery carries unread
			// (json.RawMessage); on the trip's wire it is a TripRequest.
			s.Ref = "#/components/schemas/TripRequest"
		}},
		"settled_by": {desc: "The operator who settled the step by hand (action settle: a person did the undo, or the step, outside the system); absent when the company answered.", apply: nonEmpty},
	},
	"TripSettledData": {
		"":             {desc: "Data of io.tripsaga.trip.confirmed.v1, io.tripsaga.trip.canceled.v1 and io.tripsaga.trip.canceled_by_traveler.v1: the trip is settled."},
		"trip_id":      {desc: "The trip: \"T-\" and a ULID, the event's ce-subject.", apply: pattern(TripIDPattern)},
		"status":       {desc: "The final status.", apply: func(s *jsonschema.Schema) { s.Enum = []any{"canceled", "confirmed", "canceled_by_traveler"} }},
		"reason":       {desc: "Why the trip was canceled, in words; absent when it was confirmed.", apply: nonEmpty},
		"traveler":     {desc: "Who travels, to be told."},
		"fee_cents":    {desc: "canceled_by_traveler only: the cancellation fee kept, in minor units of currency.", apply: between(0, events.MaxAmountCents)},
		"refund_cents": {desc: "canceled_by_traveler only: the amount refunded (the charge minus the fee), in minor units of currency.", apply: between(0, events.MaxAmountCents)},
		"currency":     {desc: "canceled_by_traveler only: ISO 4217 code of the charge's currency.", apply: pattern(`^[A-Z]{3}$`)},
	},
	"CancellationData": {
		"":              {desc: "Data of io.tripsaga.trip.cancellation_requested.v1: the traveler canceled a confirmed trip (POST /trips/{id}/cancellation); fee_cents + refund_cents = charged_cents."},
		"trip_id":       {desc: "The trip: \"T-\" and a ULID, the event's ce-subject.", apply: pattern(TripIDPattern)},
		"request":       {desc: "The trip request as booked."},
		"charged_cents": {desc: "What the card was charged, in minor units of currency.", apply: between(events.MinAmountCents, events.MaxAmountCents)},
		"fee_cents":     {desc: "The cancellation fee the policy keeps (services/trips/cancellation_policy.json), in minor units.", apply: between(0, events.MaxAmountCents)},
		"refund_cents":  {desc: "What is refunded: charged_cents minus fee_cents.", apply: between(0, events.MaxAmountCents)},
		"currency":      {desc: "ISO 4217 code of the charge's currency.", apply: pattern(`^[A-Z]{3}$`)},
		"band":          {desc: "The policy's fee band that applied (\"inside 7 days\", ...).", apply: nonEmpty},
		"requested_at":  {desc: "When the traveler asked (RFC 3339, UTC).", apply: format("date-time")},
	},
	"OperatorActionData": {
		"": {desc: "Data of io.tripsaga.operator.action.v1: who (operator) asked for what (action, about trip_id, carried out by service) and why (reason); when is the event's ce-time."},
		"action": {desc: "What is asked: retry_undo (call the undo now, lifting a pause), pause and resume (the trip's company calls at the service), resolve (close incidents with the reason), redrive (hand dead_letter to the consumer that parked it), undo_leak (undo by key a company record found in force that should not be), settle (record that a person did a stuck step's work by hand: its retries stop and its event is published), dismiss (close one of the reconciler's open findings as seen, with why; the reconciler carries it out).", apply: func(s *jsonschema.Schema) {
			s.Enum = []any{"retry_undo", "pause", "resume", "resolve", "redrive", "undo_leak", "settle"}
		}},
		"trip_id": {desc: "The trip the action is about, the event's ce-subject.", apply: nonEmpty},
		"service": {desc: "The service that carries the action out (trips, hotel, payment, car, insurance when on; the consumer that parked a re-driven event).", apply: nonEmpty},
		"outcome": {desc: "What a person did, for settle: undone (the stuck undo was done by hand), done or not_done (a forward step stuck unknown).", apply: func(s *jsonschema.Schema) {
			s.Enum = []any{events.SettleUndone, events.SettleDone, events.SettleNotDone}
		}},
		"step":            {desc: "The step to settle when the service owns several (mail, traveler_mail); absent: the service's saga step.", apply: nonEmpty},
		"incident":        {desc: "The incident kind to resolve (compensation_stuck...); absent resolves every open incident of the trip at the service.", apply: nonEmpty},
		"reason":          {desc: "Why, in the operator's words.", apply: nonEmpty},
		"operator":        {desc: "Who asked (a name or an email).", apply: nonEmpty},
		"idempotency_key": {desc: "The Idempotency-Key the action was asked with; a second request with it gets this event back and acts once.", apply: nonEmpty},
		"dead_letter":     {desc: "The parked event to re-drive (redrive only)."},
		"finding":         {desc: "The finding dismissed (dismiss only): its trip id, or ?<company>/<record id> for an unattributed record (trip_id is then none); its kind is in incident."},
	},
	"ParkedEvent": {
		"":           {desc: "A message an inbox parked on the DEADLETTER stream, with its original headers and body."},
		"seq":        {desc: "Its sequence in the DEADLETTER stream."},
		"stream":     {desc: "The stream it was consumed from.", apply: nonEmpty},
		"stream_seq": {desc: "Its sequence in that stream."},
		"subject":    {desc: "Its NATS subject there.", apply: nonEmpty},
		"consumer":   {desc: "The durable consumer (and inbox) that parked it, and the only one it is re-driven to.", apply: nonEmpty},
		"reason":     {desc: "Why it was parked.", apply: nonEmpty},
		"headers":    {desc: "Its original NATS headers (CloudEvents ce-* headers)."},
		"data":       {desc: "Its original body, base64."},
	},
}

// dataSchemas reflects the Go data types of the catalogue's event types
// into JSON Schemas (draft-07 keywords only, as AsyncAPI's default schema
// format is a superset of draft-07), one per Go type, with references
// "#/components/schemas/<Go type>" between them. Required properties are
// the fields without omitempty; no other property is allowed.
func dataSchemas(c events.Catalogue) (map[string]*jsonschema.Schema, error) {
	r := &jsonschema.Reflector{Anonymous: true}
	out := map[string]*jsonschema.Schema{}
	for _, et := range c.Types {
		t, ok := events.DataType(et.Data)
		if !ok {
			return nil, fmt.Errorf("asyncapi: %s: data type %q is not a data type of package events (events.DataType)", et.Type, et.Data)
		}
		s := r.ReflectFromType(t)
		for name, def := range s.Definitions {
			out[name] = def
		}
	}
	var errs []string
	for name, s := range out {
		rewriteRefs(s)
		fs, ok := fields[name]
		if !ok {
			errs = append(errs, "type "+name+" is not described")
			continue
		}
		s.Description = fs[""].desc
		if s.Properties == nil {
			continue
		}
		for pair := s.Properties.Oldest(); pair != nil; pair = pair.Next() {
			f, ok := fs[pair.Key]
			if !ok || f.desc == "" {
				errs = append(errs, fmt.Sprintf("field %s.%s is not described", name, pair.Key))
				continue
			}
			p := pair.Value
			p.Description = f.desc
			if f.apply != nil {
				f.apply(p)
			}
		}
		for key := range fs {
			if _, ok := s.Properties.Get(key); key != "" && !ok {
				errs = append(errs, fmt.Sprintf("field %s.%s is described but %s has no such field", name, key, name))
			}
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return nil, fmt.Errorf("asyncapi: the schema table (events/asyncapi/schema.go) is out of date with package events: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

// rewriteRefs points the references of s at the document's components.
func rewriteRefs(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if name, ok := strings.CutPrefix(s.Ref, "#/$defs/"); ok {
		s.Ref = schemaRef(name)
	}
	if s.Properties != nil {
		for pair := s.Properties.Oldest(); pair != nil; pair = pair.Next() {
			rewriteRefs(pair.Value)
		}
	}
	rewriteRefs(s.Items)
	rewriteRefs(s.AdditionalProperties)
	for _, sub := range slices.Concat(s.AllOf, s.AnyOf, s.OneOf) {
		rewriteRefs(sub)
	}
}

func schemaRef(name string) string { return "#/components/schemas/" + name }
