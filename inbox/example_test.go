package inbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/outbox"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// The example needs a PostgreSQL and a NATS server with JetStream, so it
// is compiled, not run. The same calls are run by this package's tests
// (inbox_test.go) and by examples/refund's view (view.go, refund_test.go),
// an inbox of a saga of its own.

// A consumer of a saga of its own: the cinema's box office follows the
// card step's events on the CARD stream and records how each booking
// went. The handler's effect (its UPDATE) and the inbox's row of the event
// (consumer, source, id) are written in one transaction, and the message
// is acked only after its COMMIT: a redelivered or replayed event finds
// its row and has no second effect, and a crash before the commit leaves
// neither, so the event comes again.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	const (
		bookingRequested = "com.example.cinema.booking.requested.v1"
		cardCharged      = "com.example.cinema.card.charged.v1"
		cardDeclined     = "com.example.cinema.card.declined.v1"
	)

	// The service's schema holds the machinery's set (the inbox's and the
	// outbox's tables) and its own tables, here bookings.
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	cfg.AfterConnect = tripsql.SetSearchPath("box_office") // migrated with tripsql.SetSaga
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}

	handler := func(ctx context.Context, tx pgx.Tx, e event.Event) error {
		var d events.StepData
		if err := events.DecodeData(e, &d); err != nil {
			return err // wraps events.ErrInvalidEvent: parked, as ErrPermanent
		}
		if d.TripID != e.Subject() {
			// No retry can cure it: park the event (to the dead-letter
			// stream, with this reason) and go on with the next.
			return fmt.Errorf("%w: data names booking %q, its subject %q", inbox.ErrPermanent, d.TripID, e.Subject())
		}
		status := "paid"
		if e.Type() == cardDeclined {
			status = "declined"
		}
		// The effect, in tx: it commits with the inbox row or not at all.
		// Any other error rolls both back and the event is redelivered
		// with backoff (200 ms doubling, Config.BackoffMax), parked only
		// after MaxDeliver deliveries while PostgreSQL answers: an outage
		// never parks. Touch only PostgreSQL here: a company is called
		// from the step log, never from a handler.
		_, err := tx.Exec(ctx, `UPDATE bookings SET status = $2 WHERE booking_id = $1`, e.Subject(), status)
		return err
	}

	// The relay publishes, right after the commit, the events the handler
	// writes with outbox.Write (none here). Give it your saga's catalogue,
	// whose streams it checks every event against; the default is the
	// trip's.
	cat := events.Catalogue{Types: []events.EventType{
		{Type: bookingRequested, Service: "box-office", Stream: "BOOKINGS"},
		{Type: cardCharged, Service: "card", Stream: "CARD"},
		{Type: cardDeclined, Service: "card", Stream: "CARD"},
	}} // yours is the whole catalogue (events.Catalogue's example)
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, JetStream: js, Catalogue: cat})
	if err != nil {
		log.Fatal(err)
	}
	in, err := inbox.New(inbox.Config{
		Name:           "box-office", // the durable consumer and the dedup scope
		Stream:         "CARD",
		FilterSubjects: cat.Streams([]string{cardCharged, cardDeclined})["CARD"], // card.charged.>, card.declined.>
		Types:          []string{cardCharged, cardDeclined},                      // any other type is parked as unknown
		Pool:           pool,
		JetStream:      js,
		Handler:        handler,
		Relay:          relay,
	})
	if err != nil {
		log.Fatal(err) // wraps inbox.ErrInvalidConfig
	}
	go func() { _ = relay.Run(ctx) }()
	// Run creates or updates the durable consumer (MaxDeliver -1 on the
	// server: the inbox counts deliveries itself) and handles events
	// until ctx ends; a stream not created yet is waited for.
	if err := in.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
