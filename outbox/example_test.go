package outbox_test

import (
	"context"
	"errors"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/outbox"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// The examples of this package need a PostgreSQL and a NATS server with
// JetStream, so they are compiled, not run. The same calls are run by
// this package's tests (outbox_test.go, local_test.go) and by
// saga/othersaga_test.go against a private cluster and an embedded
// server (package sagatest).

// A service's relay: it claims the rows of its outbox and publishes each
// event to JetStream with Nats-Msg-Id = the event's id, and marks a row
// published only after its PubAck. A crash between the publish and the
// mark publishes the event again, and JetStream drops the copy inside its
// duplicate window (events.StreamDuplicateWindow); consumers drop any
// later copy through their inbox. Any number of relays may run on one
// schema (the service's replicas).
func ExampleNewRelay() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	// Each service keeps its tables in its own schema, migrated with the
	// machinery's set (the outbox, the inbox, the step log), and every
	// connection of its pool has that schema as its search_path.
	const schema = "box_office"
	url := os.Getenv("DATABASE_URL")
	if err := tripsql.Migrate(ctx, url, schema, tripsql.SetSaga); err != nil {
		log.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		log.Fatal(err)
	}
	cfg.AfterConnect = tripsql.SetSearchPath(schema)
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

	// The saga's catalogue declares the stream of every event the relay
	// publishes (here one type; yours is the whole catalogue, see
	// events.Catalogue's example, or a family's Union). An event no stream
	// holds is refused at Write: JetStream would refuse it for ever.
	cat := events.Catalogue{Types: []events.EventType{
		{Type: "com.example.cinema.booking.requested.v1", Service: "box-office", Stream: "BOOKINGS"},
	}}
	if err := events.EnsureServiceStreams(ctx, js, cat, "box-office", 1); err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{
		Pool: pool, JetStream: js, Catalogue: cat,
		// A stream deleted at runtime is made again, and the waiting
		// events go out; until then they wait in the outbox, not lost.
		EnsureStreams: func(ctx context.Context) error {
			return events.EnsureServiceStreams(ctx, js, cat, "box-office", 1)
		},
		// Every other field has its default (RelayConfig's docs).
	})
	if err != nil {
		log.Fatal(err) // wraps outbox.ErrInvalidConfig
	}
	// Run returns nil when ctx ends. An outage (no stream, no PubAck in
	// time) is logged and retried; it never drops a row.
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// errTaken rolls the transaction back on purpose: InTx returns fn's error
// unchanged.
var errTaken = errors.New("trip id taken")

// One state change and the events it announces, in one transaction: the
// service's row and the outbox row commit together or not at all, so no
// event is published for a change that was rolled back and no change is
// left without its event. Never publish to NATS directly from a
// transaction: write the event down, and the relay publishes it.
//
// This is the trip's start, whose types the relay's default catalogue
// (events.Full) declares; a saga of its own gives its relay its catalogue
// (RelayConfig.Catalogue), which Write inside InTx checks against.
func ExampleUnitOfWork_InTx() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	cfg.AfterConnect = tripsql.SetSearchPath("trips") // migrated with tripsql.SetSaga, see NewRelay's example
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, JetStream: js})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = relay.Run(ctx) }()

	uow := outbox.UnitOfWork{Pool: pool, Relay: relay}
	const tripID = "T-01JDXQ4Z6R7N0V5C2M8K3H9B1E" // one NATS subject token
	req := events.TripRequest{
		Traveler: events.Person{Name: "Ada Lovelace", Email: "ada@example.com"},
		Hotel:    events.HotelRequest{PropertyID: "H-LIS-1", CheckIn: "2027-03-01", Nights: 2},
		Car:      events.CarRequest{CarClass: "compact", Pickup: "2027-03-01", Return: "2027-03-03"},
		Payment:  events.PaymentRequest{CardToken: "tok_visa", AmountCents: 48_000, Currency: "EUR"},
	}
	err = uow.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		// The state change, in your own table.
		tag, err := tx.Exec(ctx, `INSERT INTO my_trips (trip_id, status) VALUES ($1, 'requested')
			ON CONFLICT (trip_id) DO NOTHING`, tripID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errTaken // rolled back: nothing is written, nothing published
		}
		// Its event: the saga's id is its subject, and its id (a ULID,
		// events.New) is the Nats-Msg-Id the relay publishes it with.
		e, err := events.New(events.Source("trips"), events.TripRequested, tripID,
			events.TripRequestedData{TripID: tripID, Request: req})
		if err != nil {
			return err
		}
		// Write stores the row in tx; with ctx from InTx and the relay
		// running, that relay publishes it right after the COMMIT, and any
		// relay's claim does if this process dies first.
		return outbox.Write(ctx, tx, e)
	})
	switch {
	case errors.Is(err, errTaken):
		log.Printf("trip %s exists already", tripID)
	case err != nil:
		// A failed COMMIT ("commit: ...") may have committed all the same
		// (its answer lost): the retry must find the row, as the
		// ON CONFLICT above does.
		log.Fatal(err)
	}
}

// A saga of its own may write its events with its relay: Relay.Write
// checks them against the relay's own streams (RelayConfig.Catalogue)
// whatever ctx holds, where outbox.Write outside a unit of work of that
// relay would check them against the trip's and refuse them.
func ExampleRelay_Write() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	cfg.AfterConnect = tripsql.SetSearchPath("box_office") // migrated with tripsql.SetSaga, see NewRelay's example
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	const requested = "com.example.cinema.booking.requested.v1"
	cat := events.Catalogue{Types: []events.EventType{{Type: requested, Service: "box-office", Stream: "BOOKINGS"}}}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, JetStream: js, Catalogue: cat})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = relay.Run(ctx) }()

	type booking struct {
		Seat  string `json:"seat"`
		Email string `json:"email"`
	}
	const bookingID = "B-1042"
	err = outbox.UnitOfWork{Pool: pool, Relay: relay}.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO bookings (booking_id, status) VALUES ($1, 'requested')`, bookingID); err != nil {
			return err
		}
		// The start event carries the saga's id and its request, which
		// every step event after it carries on, unread by the machinery.
		e, err := events.New("/cinema/box-office", requested, bookingID,
			map[string]any{"trip_id": bookingID, "request": booking{Seat: "F12", Email: "ada@example.com"}})
		if err != nil {
			return err
		}
		return relay.Write(ctx, tx, e) // an error wraps events.ErrInvalidEvent: roll back
	})
	if err != nil {
		log.Fatal(err)
	}
}
