package events_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/tripsaga/tripsaga/events"
)

// A saga of your own, not the trip: a cinema books a seat (compensable:
// the seat is released), charges the card (the pivot: after it the saga
// only goes forward) and sends the ticket (forward-only: retried until
// sent, never undone). Its event types are CloudEvents types under the
// cinema's own reverse-DNS prefix, <prefix>.<entity>.<happening>.v<major>;
// the <entity>.<happening> part is the kind, which starts each event's
// NATS subject, and each stream holds "<entity>.>".
//
// Every type is declared once, with the service that publishes it and its
// stream; every published type needs a consumer (a step's trigger, a
// compensation's trigger or a projection), or Validate refuses it.
func ExampleCatalogue() {
	const (
		bookingRequested = "com.example.cinema.booking.requested.v1"

		seatHeld         = "com.example.cinema.seat.held.v1"
		seatRefused      = "com.example.cinema.seat.refused.v1"       // a business "no": nothing to undo
		seatFailed       = "com.example.cinema.seat.failed.v1"        // unknown at the deadline, released by key
		seatReleased     = "com.example.cinema.seat.released.v1"      // the compensation's event
		seatReleaseStuck = "com.example.cinema.seat.release_stuck.v1" // the release raised its incident and goes on retrying

		cardCharged     = "com.example.cinema.card.charged.v1"
		cardDeclined    = "com.example.cinema.card.declined.v1"
		cardFailed      = "com.example.cinema.card.failed.v1"       // unknown at the deadline, canceled by key
		cardCancelStuck = "com.example.cinema.card.cancel_stuck.v1" // that cancel raised its incident

		ticketSent = "com.example.cinema.ticket.sent.v1"
	)
	step := "events.StepData" // the data of every step event
	cat := events.Catalogue{
		// The start event: the box office took the booking. A step
		// service checks a trigger from another step service against it
		// (saga.OriginOf).
		Start: bookingRequested,
		Types: []events.EventType{
			{Type: bookingRequested, Service: "box-office", Stream: "BOOKINGS", Data: "Booking", Describes: "a customer asked for a seat"},
			{Type: seatHeld, Service: "seats", Stream: "SEATS", Data: step, Describes: "the seat is held"},
			{Type: seatRefused, Service: "seats", Stream: "SEATS", Data: step, Describes: "the seat is taken"},
			{Type: seatFailed, Service: "seats", Stream: "SEATS", Data: step, Describes: "the hold was unknown at its deadline and released by key"},
			{Type: seatReleased, Service: "seats", Stream: "SEATS", Data: step, Describes: "the seat was released (compensation)"},
			{Type: seatReleaseStuck, Service: "seats", Stream: "SEATS", Data: step, Describes: "the release raised its incident and goes on retrying"},
			{Type: cardCharged, Service: "card", Stream: "CARD", Data: step, Describes: "the card is charged (pivot done)"},
			{Type: cardDeclined, Service: "card", Stream: "CARD", Data: step, Describes: "the card was declined"},
			{Type: cardFailed, Service: "card", Stream: "CARD", Data: step, Describes: "the charge was unknown at its deadline and canceled by key"},
			{Type: cardCancelStuck, Service: "card", Stream: "CARD", Data: step, Describes: "the cancel by key raised its incident and goes on retrying"},
			{Type: ticketSent, Service: "mail", Stream: "MAIL", Data: step, Describes: "the ticket was sent"},
		},
		// In saga order: compensable steps, exactly one pivot, then
		// forward-only steps.
		Steps: []events.Step{
			{
				Name: "seats", Service: "seats", Class: events.Compensable,
				Trigger:   []string{bookingRequested},
				Publishes: []string{seatHeld, seatRefused, seatFailed},
				// The undo, by the same Idempotency-Key, when a later step
				// fails or its own undo is stuck: newest first.
				Compensation: &events.Compensation{
					Name:      "release",
					Trigger:   []string{cardDeclined, cardFailed, cardCancelStuck},
					Publishes: []string{seatReleased},
					Stuck:     seatReleaseStuck,
				},
			},
			{
				Name: "card", Service: "card", Class: events.Pivot,
				Trigger:   []string{seatHeld},
				Publishes: []string{cardCharged, cardDeclined, cardFailed},
				Stuck:     cardCancelStuck,
			},
			{
				Name: "mail", Service: "mail", Class: events.ForwardOnly,
				Trigger:   []string{cardCharged},
				Publishes: []string{ticketSent},
			},
		},
		// A read model that only follows events: the box office's list of
		// bookings and how each ended.
		Projections: []events.Projection{
			{Name: "bookings", Service: "box-office", Consumes: []string{
				seatRefused, seatFailed, seatReleased, seatReleaseStuck, cardCharged, ticketSent,
			}},
		},
	}

	// Validate before anything runs: a process refuses a bad catalogue at
	// start, not at its first event.
	fmt.Println("valid:", cat.Validate() == nil)

	for _, s := range cat.Steps {
		fmt.Printf("step %s (%s): done on %s\n", s.Name, s.Class, events.Kind(s.Done()))
	}

	// Each event goes on the NATS subject <kind>.<saga id>; the saga id
	// is one subject token.
	subject, err := events.Subject(seatHeld, "B-1042")
	fmt.Println("subject:", subject, err)

	// The streams to create (events.EnsureStreams, or each service its
	// own with events.EnsureServiceStreams) and the subjects each holds.
	streams := cat.StreamSubjects()
	for _, name := range slices.Sorted(maps.Keys(streams)) {
		fmt.Printf("stream %s: %s\n", name, strings.Join(streams[name], " "))
	}

	// What the seats service consumes, and the filter subjects of the
	// inbox it needs on each stream (saga.NewService derives the same).
	byStream := cat.Streams(cat.Consumes("seats"))
	for _, name := range slices.Sorted(maps.Keys(byStream)) {
		fmt.Printf("seats reads %s: %s\n", name, strings.Join(byStream[name], " "))
	}

	// Output:
	// valid: true
	// step seats (compensable): done on seat.held
	// step card (pivot): done on card.charged
	// step mail (forward-only): done on ticket.sent
	// subject: seat.held.B-1042 <nil>
	// stream BOOKINGS: booking.>
	// stream CARD: card.>
	// stream MAIL: ticket.>
	// stream SEATS: seat.>
	// seats reads BOOKINGS: booking.requested.>
	// seats reads CARD: card.cancel_stuck.> card.declined.> card.failed.>
}

// Validate names every rule a catalogue breaks, each error wrapping
// ErrInvalidCatalogue: here a compensable step placed after the pivot,
// which could never be undone once the pivot is done.
func ExampleCatalogue_Validate() {
	const (
		placed   = "com.example.shop.order.placed.v1"
		shipped  = "com.example.shop.parcel.shipped.v1"
		refused  = "com.example.shop.parcel.refused.v1"
		reserved = "com.example.shop.stock.reserved.v1"
		released = "com.example.shop.stock.released.v1"
	)
	cat := events.Catalogue{
		Start: placed,
		Types: []events.EventType{
			{Type: placed, Service: "shop", Stream: "ORDERS"},
			{Type: shipped, Service: "courier", Stream: "COURIER"},
			{Type: refused, Service: "courier", Stream: "COURIER"},
			{Type: reserved, Service: "stock", Stream: "STOCK"},
			{Type: released, Service: "stock", Stream: "STOCK"},
		},
		Steps: []events.Step{
			{Name: "courier", Service: "courier", Class: events.Pivot, Trigger: []string{placed}, Publishes: []string{shipped, refused}},
			{
				Name: "stock", Service: "stock", Class: events.Compensable, Trigger: []string{shipped}, Publishes: []string{reserved},
				Compensation: &events.Compensation{Name: "release", Trigger: []string{refused}, Publishes: []string{released}},
			},
		},
		Projections: []events.Projection{{Name: "orders", Service: "shop", Consumes: []string{reserved, released}}},
	}
	err := cat.Validate()
	fmt.Println(errors.Is(err, events.ErrInvalidCatalogue))
	fmt.Println(err)
	// Output:
	// true
	// events: invalid catalogue: compensable step stock comes after the pivot
	// events: invalid catalogue: step stock after the pivot is compensable, not forward-only
}
