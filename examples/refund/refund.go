// Package refund is a second saga on the tripsaga machinery, from another
// domain than the trip: the refund saga of the compensation literature.
// A customer returns an order for a refund:
//
//  1. hold: place a hold on the order (compensable: the hold released);
//  2. inventory: return the items to inventory (compensable: taken back out);
//  3. credit: issue the credit (the pivot: after it only forward);
//  4. reply: send the reply to the customer (forward-only: an email
//     cannot be unsent, so it is retried until sent).
//
// It is its own Go module and imports only the project's public packages
// (events, saga, outbox, provider): its own catalogue under its own
// reverse-DNS prefix (com.example.refund), its own streams, its own
// request type ([Refund]), one saga.NewService per step, and a view of its
// own ([View]) that follows the events and records each refund's state.
package refund

import (
	"errors"
	"fmt"
	"net/mail"
	"regexp"
	"strconv"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
)

// The refund saga's event types: CloudEvents types under its own
// reverse-DNS prefix, <entity>.<happening>.v<major> (docs/own-saga.md).
const (
	Requested = "com.example.refund.refund.requested.v1"

	HoldPlaced       = "com.example.refund.hold.placed.v1"
	HoldRefused      = "com.example.refund.hold.refused.v1"
	HoldFailed       = "com.example.refund.hold.failed.v1"
	HoldReleased     = "com.example.refund.hold.released.v1"
	HoldReleaseStuck = "com.example.refund.hold.release_stuck.v1"

	InventoryReturned      = "com.example.refund.inventory.returned.v1"
	InventoryRefused       = "com.example.refund.inventory.refused.v1"
	InventoryFailed        = "com.example.refund.inventory.failed.v1"
	InventoryTakenBack     = "com.example.refund.inventory.taken_back.v1"
	InventoryTakeBackStuck = "com.example.refund.inventory.take_back_stuck.v1"

	CreditIssued      = "com.example.refund.credit.issued.v1"       //nolint:gosec // an event type, not a credential
	CreditRefused     = "com.example.refund.credit.refused.v1"      //nolint:gosec // an event type, not a credential
	CreditFailed      = "com.example.refund.credit.failed.v1"       //nolint:gosec // an event type, not a credential
	CreditCancelStuck = "com.example.refund.credit.cancel_stuck.v1" //nolint:gosec // an event type, not a credential

	ReplySent = "com.example.refund.reply.sent.v1"
)

// The saga's streams, one per publishing service.
const (
	StreamRefunds   = "REFUNDS"
	StreamHolds     = "HOLDS"
	StreamInventory = "INVENTORY"
	StreamCredit    = "CREDIT"
	StreamReply     = "REPLY"
)

// The services: the refunds desk (takes the request, keeps the view) and
// one per step.
const (
	ServiceRefunds   = "refunds"
	ServiceHold      = "hold"
	ServiceInventory = "inventory"
	ServiceCredit    = "credit"
	ServiceReply     = "reply"
)

// Catalogue declares the refund saga: its events, its four steps in saga
// order (two compensable, the pivot, one forward-only) and its view.
// Catalogue().Validate() holds (the test checks it).
func Catalogue() events.Catalogue {
	step := "StepData"
	return events.Catalogue{
		Start: Requested,
		Types: []events.EventType{
			{Type: Requested, Service: ServiceRefunds, Stream: StreamRefunds, Data: "Refund", Describes: "a customer returned an order for a refund"},
			{Type: HoldPlaced, Service: ServiceHold, Stream: StreamHolds, Data: step, Describes: "the order is on hold"},
			{Type: HoldRefused, Service: ServiceHold, Stream: StreamHolds, Data: step, Describes: "the order cannot be held (nothing to undo)"},
			{Type: HoldFailed, Service: ServiceHold, Stream: StreamHolds, Data: step, Describes: "the hold was unknown at its deadline and released by key"},
			{Type: HoldReleased, Service: ServiceHold, Stream: StreamHolds, Data: step, Describes: "the hold was released (compensation)"},
			{Type: HoldReleaseStuck, Service: ServiceHold, Stream: StreamHolds, Data: step, Describes: "the release raised its incident and goes on retrying"},
			{Type: InventoryReturned, Service: ServiceInventory, Stream: StreamInventory, Data: step, Describes: "the items are back in inventory"},
			{Type: InventoryRefused, Service: ServiceInventory, Stream: StreamInventory, Data: step, Describes: "the warehouse refused the items"},
			{Type: InventoryFailed, Service: ServiceInventory, Stream: StreamInventory, Data: step, Describes: "the return was unknown at its deadline and taken back by key"},
			{Type: InventoryTakenBack, Service: ServiceInventory, Stream: StreamInventory, Data: step, Describes: "the items were taken back out of inventory (compensation)"},
			{Type: InventoryTakeBackStuck, Service: ServiceInventory, Stream: StreamInventory, Data: step, Describes: "the take-back raised its incident and goes on retrying; the hold is released meanwhile"},
			{Type: CreditIssued, Service: ServiceCredit, Stream: StreamCredit, Data: step, Describes: "the credit is issued (pivot done)"},
			{Type: CreditRefused, Service: ServiceCredit, Stream: StreamCredit, Data: step, Describes: "the credit was refused"},
			{Type: CreditFailed, Service: ServiceCredit, Stream: StreamCredit, Data: step, Describes: "the credit was unknown at its deadline and canceled by key"},
			{Type: CreditCancelStuck, Service: ServiceCredit, Stream: StreamCredit, Data: step, Describes: "the cancel by key of a credit unknown at its deadline raised its incident and goes on retrying"},
			{Type: ReplySent, Service: ServiceReply, Stream: StreamReply, Data: step, Describes: "the customer was sent the reply"},
		},
		Steps: []events.Step{
			{
				Name: ServiceHold, Service: ServiceHold, Class: events.Compensable,
				Trigger: []string{Requested}, Publishes: []string{HoldPlaced, HoldRefused, HoldFailed},
				Compensation: &events.Compensation{
					Name:      "release",
					Trigger:   []string{InventoryRefused, InventoryFailed, InventoryTakenBack, InventoryTakeBackStuck},
					Publishes: []string{HoldReleased}, Stuck: HoldReleaseStuck,
				},
			},
			{
				Name: ServiceInventory, Service: ServiceInventory, Class: events.Compensable,
				Trigger: []string{HoldPlaced}, Publishes: []string{InventoryReturned, InventoryRefused, InventoryFailed},
				Compensation: &events.Compensation{
					Name:      "take_back",
					Trigger:   []string{CreditRefused, CreditFailed, CreditCancelStuck},
					Publishes: []string{InventoryTakenBack}, Stuck: InventoryTakeBackStuck,
				},
			},
			{
				Name: ServiceCredit, Service: ServiceCredit, Class: events.Pivot,
				Trigger: []string{InventoryReturned}, Publishes: []string{CreditIssued, CreditRefused, CreditFailed},
				Stuck: CreditCancelStuck,
			},
			{
				Name: ServiceReply, Service: ServiceReply, Class: events.ForwardOnly,
				Trigger: []string{CreditIssued}, Publishes: []string{ReplySent},
			},
		},
		Projections: []events.Projection{
			{Name: "refunds", Service: ServiceRefunds, Consumes: viewTypes()},
		},
	}
}

// Refund is the saga's request: what refund.requested carries under
// "request" and every step event after it carries on, unread by the
// machinery ([saga.Payload]).
type Refund struct {
	// OrderID is the returned order's id, also the saga's id: one NATS
	// subject token (letters, digits, '-', '_').
	OrderID string `json:"order_id"`
	// Items are the returned items, at least one.
	Items []Item `json:"items"`
	// AmountCents is the credit, in minor units (cents), > 0.
	AmountCents int64 `json:"amount_cents"`
	// Currency is the credit's ISO 4217 code ("EUR").
	Currency string `json:"currency"`
	// Email is the customer's address (RFC 5322), where the reply goes.
	Email string `json:"email"`
}

// Item is one returned line of the order.
type Item struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"` // > 0
}

// ErrInvalidRefund is wrapped by every error of [Refund.Validate].
var ErrInvalidRefund = errors.New("refund: invalid request")

var (
	orderIDPattern  = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)
)

// Validate returns an error wrapping [ErrInvalidRefund] naming each field
// it refuses: order_id (1 to 64 of [A-Za-z0-9_-], a NATS subject token),
// items (at least one; each items[i].sku non-empty and items[i].quantity
// > 0), amount_cents (> 0), currency (three capital letters, ISO 4217),
// email (an address, RFC 5322 as net/mail parses it).
func (r Refund) Validate() error {
	var errs []error
	bad := func(field, why string) { errs = append(errs, fmt.Errorf("%w: %s %s", ErrInvalidRefund, field, why)) }
	if !orderIDPattern.MatchString(r.OrderID) {
		bad("order_id", "must be 1 to 64 of A-Z, a-z, 0-9, '-' and '_'")
	}
	if len(r.Items) == 0 {
		bad("items", "must name at least one item")
	}
	for i, it := range r.Items {
		if it.SKU == "" {
			bad("items["+strconv.Itoa(i)+"].sku", "is required")
		}
		if it.Quantity < 1 {
			bad("items["+strconv.Itoa(i)+"].quantity", "must be > 0")
		}
	}
	if r.AmountCents < 1 {
		bad("amount_cents", "must be > 0 (minor units)")
	}
	if !currencyPattern.MatchString(r.Currency) {
		bad("currency", "must be an ISO 4217 code of three capital letters")
	}
	if a, err := mail.ParseAddress(r.Email); err != nil || a.Address != r.Email {
		bad("email", "must be a bare email address")
	}
	return errors.Join(errs...)
}

// quantity is how many items the refund returns.
func (r Refund) quantity() int {
	n := 0
	for _, it := range r.Items {
		n += it.Quantity
	}
	return n
}

// RequestedData is the data of refund.requested: the saga's id (on the
// wire "trip_id", the machinery's step data still names it so:
// docs/own-saga.md) and its request.
type RequestedData struct {
	ID      string `json:"trip_id"`
	Request Refund `json:"request"`
}

// NewRequested returns the refund.requested event of r, its subject the
// order id. An invalid r is refused (see [Refund.Validate]).
func NewRequested(r Refund) (event.Event, error) {
	if err := r.Validate(); err != nil {
		return event.Event{}, err
	}
	return events.New("/refunds", Requested, r.OrderID, RequestedData{ID: r.OrderID, Request: r})
}

// Companies are the outside companies the steps call, each following
// providers.md's protocol (create by Idempotency-Key, status by key, undo
// by the same key). The example runs them on the project's simulators
// (sim): the warehouse's order desk keeps holds (its hotel), its stock
// keeps returns as bookings (its car firm), the card processor issues the
// credit (a charge, the card's line), the mail relay sends the reply.
type Companies struct {
	Holds, Returns, Credits, Replies *provider.Client
}

// SimCompanies returns the [Companies] of the simulators served at
// baseURL (sim.Simulators.Handler: /hotel, /cars, /payments, /mail).
func SimCompanies(baseURL string) Companies {
	return Companies{
		Holds:   provider.Hotel(baseURL + "/hotel"),
		Returns: provider.Cars(baseURL + "/cars"),
		Credits: provider.Payments(baseURL + "/payments"),
		Replies: provider.Mail(baseURL + "/mail"),
	}
}

// The company requests, as providers.md spells each body.
type (
	holdBody struct {
		TripID     string        `json:"trip_id"`
		PropertyID string        `json:"property_id"`
		CheckIn    string        `json:"check_in"`
		Nights     int           `json:"nights"`
		Guest      events.Person `json:"guest"`
	}
	returnBody struct {
		TripID   string        `json:"trip_id"`
		CarClass string        `json:"car_class"`
		Pickup   string        `json:"pickup"`
		Return   string        `json:"return"`
		Driver   events.Person `json:"driver"`
	}
	creditBody struct {
		TripID      string `json:"trip_id"`
		AmountCents int64  `json:"amount_cents"`
		Currency    string `json:"currency"`
		CardToken   string `json:"card_token"`
	}
	replyBody struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
		Text    string `json:"text"`
		TripID  string `json:"trip_id"`
	}
)

// holdDay is the day the simulators' holds and returns are booked on: the
// hotel and car firm contract wants dates; a refund has none of its own.
const holdDay, holdDayAfter = "2027-01-15", "2027-01-16"

func customer(r Refund) events.Person {
	return events.Person{Name: "Customer " + r.OrderID, Email: r.Email}
}

// Config is what the refund saga's services need.
type Config struct {
	JetStream jetstream.JetStream
	// Pools are the services' own pools (each its schema, migrated with
	// the machinery's set, sql/migrations/saga), by service name: hold,
	// inventory, credit, reply.
	Pools     map[string]*pgxpool.Pool
	Companies Companies
	// Timing of every step (zero: the defaults of saga.Timing).
	Timing saga.Timing
}

// Services builds the four step services, one saga.NewService per step,
// in saga order. Each trigger from another step service is carried out
// only for a refund the refunds desk took, with its request unchanged
// (saga.OriginOf: refund.requested in the REFUNDS stream).
func Services(cfg Config) ([]*saga.Service, error) {
	cat := Catalogue()
	if err := cat.Validate(); err != nil {
		return nil, err
	}
	family := events.Single(cat)
	origin := saga.OriginOf(cfg.JetStream, cat)
	c := cfg.Companies
	type def struct {
		spec  saga.Spec
		build saga.BuildFunc
	}
	defs := []def{
		{
			spec: saga.Spec{
				Name: ServiceHold, Service: ServiceHold, Class: events.Compensable, Company: c.Holds, ActiveStatus: c.Holds.ActiveStatus,
				OnDone: HoldPlaced, OnRejected: HoldRefused, OnFailed: HoldFailed, OnUndone: HoldReleased,
			},
			build: saga.Builder(func(id string, r Refund) (any, error) {
				return holdBody{TripID: id, PropertyID: "ORDER-DESK", CheckIn: holdDay, Nights: 1, Guest: customer(r)}, nil
			}),
		},
		{
			spec: saga.Spec{
				Name: ServiceInventory, Service: ServiceInventory, Class: events.Compensable, Company: c.Returns, ActiveStatus: c.Returns.ActiveStatus,
				OnDone: InventoryReturned, OnRejected: InventoryRefused, OnFailed: InventoryFailed, OnUndone: InventoryTakenBack,
			},
			build: saga.Builder(func(id string, r Refund) (any, error) {
				return returnBody{TripID: id, CarClass: "return-" + strconv.Itoa(r.quantity()), Pickup: holdDay, Return: holdDayAfter, Driver: customer(r)}, nil
			}),
		},
		{
			spec: saga.Spec{
				Name: ServiceCredit, Service: ServiceCredit, Class: events.Pivot, Company: c.Credits, ActiveStatus: c.Credits.ActiveStatus,
				RejectedStatus: c.Credits.RejectedStatus, RejectedReason: c.Credits.RejectedReason,
				OnDone: CreditIssued, OnRejected: CreditRefused, OnFailed: CreditFailed,
			},
			build: saga.Builder(func(id string, r Refund) (any, error) {
				return creditBody{TripID: id, AmountCents: r.AmountCents, Currency: r.Currency, CardToken: "tok_" + id}, nil
			}),
		},
		{
			spec: saga.Spec{
				Name: ServiceReply, Service: ServiceReply, Class: events.ForwardOnly, Company: c.Replies, ActiveStatus: c.Replies.ActiveStatus,
				OnDone: ReplySent,
			},
			build: saga.Builder(func(id string, r Refund) (any, error) {
				text := fmt.Sprintf("Your return of order %s is refunded: %d.%02d %s.", r.OrderID, r.AmountCents/100, r.AmountCents%100, r.Currency)
				return replyBody{To: r.Email, Subject: "Your refund", Text: text, TripID: id}, nil
			}),
		},
	}
	var out []*saga.Service
	for _, d := range defs {
		pool := cfg.Pools[d.spec.Service]
		if pool == nil {
			return nil, fmt.Errorf("refund: Pools[%q] is required", d.spec.Service)
		}
		var o saga.OriginFunc
		if d.spec.Name != ServiceHold {
			o = origin // the hold's trigger is the start event itself
		}
		svc, err := saga.NewService(saga.ServiceConfig{
			Pool: pool, JetStream: cfg.JetStream, Catalogue: cat, Family: family, Timing: cfg.Timing,
			Spec: d.spec, Build: d.build, Origin: o,
		})
		if err != nil {
			return nil, fmt.Errorf("refund: %s: %w", d.spec.Name, err)
		}
		out = append(out, svc)
	}
	return out, nil
}
