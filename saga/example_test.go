package saga_test

import (
	"context"
	"errors"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// The example needs a PostgreSQL, a NATS server with JetStream and the
// company, so it is compiled, not run. The same calls are run against a
// private cluster, an embedded server and the simulators by
// TestAnotherSagaRunsOnTheMachinery (othersaga_test.go) and by
// examples/refund's tests.

// The shop's saga: reserve the stock (compensable: released), then hand
// the parcel to the courier (the pivot). Its types are under the shop's
// own reverse-DNS prefix.
const (
	OrderPlaced    = "com.example.shop.order.placed.v1"
	StockReserved  = "com.example.shop.stock.reserved.v1"
	StockSoldOut   = "com.example.shop.stock.sold_out.v1"
	StockFailed    = "com.example.shop.stock.failed.v1"
	StockReleased  = "com.example.shop.stock.released.v1"
	ParcelTaken    = "com.example.shop.parcel.taken.v1"
	ParcelRefused  = "com.example.shop.parcel.refused.v1"
	ParcelFailed   = "com.example.shop.parcel.failed.v1"
	ParcelUnstuck  = "com.example.shop.parcel.cancel_stuck.v1"
	StreamOrders   = "ORDERS"
	StreamStock    = "STOCK"
	StreamShipping = "SHIPPING"
)

// ShopCatalogue declares the shop's saga (see events.Catalogue's example).
func ShopCatalogue() events.Catalogue {
	step := "events.StepData"
	return events.Catalogue{
		Start: OrderPlaced,
		Types: []events.EventType{
			{Type: OrderPlaced, Service: "shop", Stream: StreamOrders, Data: "Order", Describes: "a customer placed an order"},
			{Type: StockReserved, Service: "stock", Stream: StreamStock, Data: step, Describes: "the items are reserved"},
			{Type: StockSoldOut, Service: "stock", Stream: StreamStock, Data: step, Describes: "out of stock"},
			{Type: StockFailed, Service: "stock", Stream: StreamStock, Data: step, Describes: "unknown at the deadline, released by key"},
			{Type: StockReleased, Service: "stock", Stream: StreamStock, Data: step, Describes: "the reservation was released (compensation)"},
			{Type: ParcelTaken, Service: "courier", Stream: StreamShipping, Data: step, Describes: "the courier took the parcel (pivot done)"},
			{Type: ParcelRefused, Service: "courier", Stream: StreamShipping, Data: step, Describes: "the courier refused the parcel"},
			{Type: ParcelFailed, Service: "courier", Stream: StreamShipping, Data: step, Describes: "unknown at the deadline, canceled by key"},
			{Type: ParcelUnstuck, Service: "courier", Stream: StreamShipping, Data: step, Describes: "that cancel raised its incident and goes on retrying"},
		},
		Steps: []events.Step{
			{
				Name: "stock", Service: "stock", Class: events.Compensable,
				Trigger: []string{OrderPlaced}, Publishes: []string{StockReserved, StockSoldOut, StockFailed},
				Compensation: &events.Compensation{Name: "release", Trigger: []string{ParcelRefused, ParcelFailed, ParcelUnstuck}, Publishes: []string{StockReleased}},
			},
			{
				Name: "courier", Service: "courier", Class: events.Pivot,
				Trigger: []string{StockReserved}, Publishes: []string{ParcelTaken, ParcelRefused, ParcelFailed}, Stuck: ParcelUnstuck,
			},
		},
		Projections: []events.Projection{
			{Name: "orders", Service: "shop", Consumes: []string{StockSoldOut, StockFailed, StockReleased, ParcelTaken}},
		},
	}
}

// Order is the shop saga's request: what order.placed carries under
// "request", carried on unread by every step event after it.
type Order struct {
	OrderID  string `json:"order_id"`
	Quantity int    `json:"quantity"` // > 0
	Postcode string `json:"postcode"`
}

var errInvalidOrder = errors.New("shop: invalid order")

// Validate makes Order a saga.Payload: events are untrusted input, and a
// step checks the request before any company is called.
func (o Order) Validate() error {
	if o.OrderID == "" || o.Quantity < 1 || o.Postcode == "" {
		return errInvalidOrder
	}
	return nil
}

// The courier's step service. The runner follows the project's rules:
//
//   - Write down before you call: the trigger event's inbox transaction
//     records the step in the step log, and the company is called only
//     after that commit, with the Idempotency-Key "<order id>:courier";
//     a crash anywhere is resumed from the log by the recovery pass (Run)
//     with the same key, so the parcel is handed over once.
//   - Unknown is not failed: a timeout, a 5xx or a lost answer leaves the
//     outcome unknown (provider.ErrUnknownOutcome), and the company is
//     asked by key until Timing.StepDeadline; only then is the step undone
//     by key and OnFailed published. OnRejected is the company's business
//     "no", never retried.
//   - Every event is published by the service's outbox relay, with
//     Nats-Msg-Id = the event's id.
func ExampleNewService() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cat := ShopCatalogue()
	if err := cat.Validate(); err != nil {
		log.Fatal(err) // wraps events.ErrInvalidCatalogue
	}

	// The service's own schema, migrated with the machinery's set: the
	// step log, the outbox, the inbox.
	const schema = "courier"
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

	// The company, in its own words, following providers.md: create by
	// POST /parcels with an Idempotency-Key, status by GET /parcels/{key},
	// undo by POST /parcels/{key}/cancel.
	courier := &provider.Client{
		Company: "courier", BaseURL: os.Getenv("COURIER_URL"),
		Resource: "parcels", IDField: "parcel_id", UndoVerb: "cancel",
		ActiveStatus: "taken", UndoneStatus: "canceled", Statuses: []string{"taken", "canceled"},
	}
	type handOver struct {
		OrderID  string `json:"order_id"`
		Parcels  int    `json:"parcels"`
		Postcode string `json:"postcode"`
	}
	svc, err := saga.NewService(saga.ServiceConfig{
		Pool: pool, JetStream: js,
		Catalogue: cat, Family: events.Single(cat), // one version of the saga
		Spec: saga.Spec{
			Name: "courier", Service: "courier", Class: events.Pivot,
			Company: courier, ActiveStatus: courier.ActiveStatus,
			OnDone: ParcelTaken, OnRejected: ParcelRefused, OnFailed: ParcelFailed,
			// OnStuck is taken from the catalogue (the pivot's Stuck).
		},
		// The company's request body, built from the carried request,
		// decoded as an Order and checked by its Validate first (an
		// invalid one parks the trigger; nothing is called).
		Build: saga.Builder(func(orderID string, o Order) (any, error) {
			return handOver{OrderID: orderID, Parcels: o.Quantity, Postcode: o.Postcode}, nil
		}),
		// stock.reserved comes from another step service: it is carried
		// out only for an order the shop placed, with the same request
		// (its order.placed in the ORDERS stream).
		Origin: saga.OriginOf(js, cat),
		// Timing: zero fields take saga.Timing's defaults.
	})
	if err != nil {
		log.Fatal(err) // wraps saga.ErrInvalidConfig: the Spec disagrees with the catalogue
	}
	// Run registers this replica, runs the recovery pass, then the runner,
	// the relay and the inboxes until ctx ends; replicas share the work.
	if err := svc.Run(ctx, func() { log.Print("courier ready") }); err != nil {
		log.Fatal(err)
	}
}
