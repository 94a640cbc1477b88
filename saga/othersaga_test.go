package saga_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/sagatest"
	"github.com/tripsaga/tripsaga/sim"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// The shop's saga, another than the trip: reserve the stock (compensable:
// released), then hand the parcel to the courier (the pivot). Its event
// types have the shop's own reverse-DNS prefix.
const (
	orderPlaced       = "com.example.shop.order.placed.v1"
	stockReserved     = "com.example.shop.stock.reserved.v1"
	stockSoldOut      = "com.example.shop.stock.sold_out.v1"
	stockFailed       = "com.example.shop.stock.failed.v1"
	stockReleased     = "com.example.shop.stock.released.v1"
	parcelHandedOver  = "com.example.shop.parcel.handed_over.v1"
	parcelRefused     = "com.example.shop.parcel.refused.v1"
	parcelFailed      = "com.example.shop.parcel.failed.v1"
	streamOrders      = "ORDERS"
	streamStock       = "STOCK"
	streamCourier     = "COURIER"
	shopOrderPostcode = "75011"
)

// shopCatalogue declares the shop saga.
func shopCatalogue() events.Catalogue {
	return events.Catalogue{
		Start: orderPlaced,
		Types: []events.EventType{
			{Type: orderPlaced, Service: "shop", Stream: streamOrders, Data: "order", Describes: "a customer placed an order"},
			{Type: stockReserved, Service: "stock", Stream: streamStock, Data: "StepData", Describes: "the items are reserved"},
			{Type: stockSoldOut, Service: "stock", Stream: streamStock, Data: "StepData", Describes: "out of stock"},
			{Type: stockFailed, Service: "stock", Stream: streamStock, Data: "StepData", Describes: "unknown at the deadline, released by key"},
			{Type: stockReleased, Service: "stock", Stream: streamStock, Data: "StepData", Describes: "the reservation was released (compensation)"},
			{Type: parcelHandedOver, Service: "courier", Stream: streamCourier, Data: "StepData", Describes: "the courier took the parcel (pivot done)"},
			{Type: parcelRefused, Service: "courier", Stream: streamCourier, Data: "StepData", Describes: "the courier refused the parcel"},
			{Type: parcelFailed, Service: "courier", Stream: streamCourier, Data: "StepData", Describes: "unknown at the deadline, canceled by key"},
		},
		Steps: []events.Step{
			{
				Name: "stock", Service: "stock", Class: events.Compensable,
				Trigger: []string{orderPlaced}, Publishes: []string{stockReserved, stockSoldOut, stockFailed},
				Compensation: &events.Compensation{Name: "release", Trigger: []string{parcelRefused, parcelFailed}, Publishes: []string{stockReleased}},
			},
			{
				Name: "courier", Service: "courier", Class: events.Pivot,
				Trigger: []string{stockReserved}, Publishes: []string{parcelHandedOver, parcelRefused, parcelFailed},
			},
		},
		Projections: []events.Projection{
			{Name: "orders", Service: "shop", Consumes: []string{stockSoldOut, stockFailed, stockReleased, parcelHandedOver}},
		},
	}
}

// shopOrder is the shop saga's request: an order with an address, which
// the trip's request has no place for.
type shopOrder struct {
	OrderID  string `json:"order_id"`
	Quantity int    `json:"quantity"`
	Address  struct {
		Street   string `json:"street"`
		Postcode string `json:"postcode"`
	} `json:"address"`
	Email string `json:"email"`
}

func (o shopOrder) Validate() error {
	if o.OrderID == "" || o.Quantity < 1 || o.Quantity > 1000 || o.Address.Postcode == "" {
		return errQuantity
	}
	return nil
}

// TestAnotherSagaRunsOnTheMachinery (issue 18): a saga of another domain,
// with its own catalogue (one version: events.Single), its own request
// type and event-type prefix, its own streams, runs on saga.NewService,
// the outbox, the inbox and provider.Client, with companies that follow
// providers.md (the simulators' hotel as the warehouse, its cars as the
// courier). An order goes through whole; an order the courier refuses is
// unwound (the reservation released, by the same key); an order whose
// hand-over answer is lost is asked about by key and done once, not
// twice. No trip event, stream or word is involved.
func TestAnotherSagaRunsOnTheMachinery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cat := shopCatalogue()
	require.NoError(t, cat.Validate())
	family := events.Single(cat)

	dbURL := sagatest.Postgres(t)
	stockPool := sagatest.PoolAt(t, dbURL, "stock", tripsql.SetSaga)
	courierPool := sagatest.PoolAt(t, dbURL, "courier", tripsql.SetSaga)
	sims, err := sim.New(ctx, sim.Config{DatabaseURL: dbURL})
	require.NoError(t, err)
	srv := httptest.NewServer(sims.Handler())
	t.Cleanup(func() { srv.Close(); sims.Close() })
	warehouse, courier := provider.Hotel(srv.URL+"/hotel"), provider.Cars(srv.URL+"/cars")
	_, _, js := sagatest.JetStream(t, cat)

	type reserve struct {
		TripID     string        `json:"trip_id"`
		PropertyID string        `json:"property_id"`
		CheckIn    string        `json:"check_in"`
		Nights     int           `json:"nights"`
		Guest      events.Person `json:"guest"`
	}
	type handOver struct {
		TripID   string        `json:"trip_id"`
		CarClass string        `json:"car_class"`
		Pickup   string        `json:"pickup"`
		Return   string        `json:"return"`
		Driver   events.Person `json:"driver"`
	}
	who := func(o shopOrder) events.Person { return events.Person{Name: "Shop Customer", Email: o.Email} }
	stock, err := saga.NewService(saga.ServiceConfig{
		Pool: stockPool, JetStream: js, Catalogue: cat, Family: family, Timing: unhurried,
		Spec: saga.Spec{
			Name: "stock", Service: "stock", Class: events.Compensable, Company: warehouse, ActiveStatus: warehouse.ActiveStatus,
			OnDone: stockReserved, OnRejected: stockSoldOut, OnFailed: stockFailed, OnUndone: stockReleased,
		},
		Build: saga.Builder(func(id string, o shopOrder) (any, error) {
			return reserve{TripID: id, PropertyID: "WAREHOUSE-1", CheckIn: "2027-01-15", Nights: o.Quantity, Guest: who(o)}, nil
		}),
	})
	require.NoError(t, err)
	carrier, err := saga.NewService(saga.ServiceConfig{
		Pool: courierPool, JetStream: js, Catalogue: cat, Family: family, Timing: unhurried,
		Spec: saga.Spec{
			Name: "courier", Service: "courier", Class: events.Pivot, Company: courier, ActiveStatus: courier.ActiveStatus,
			OnDone: parcelHandedOver, OnRejected: parcelRefused, OnFailed: parcelFailed,
		},
		Build: saga.Builder(func(id string, o shopOrder) (any, error) {
			return handOver{TripID: id, CarClass: "parcel-" + o.Address.Postcode, Pickup: "2027-01-15", Return: "2027-01-16", Driver: who(o)}, nil
		}),
		// A reservation is carried out only for an order the shop placed,
		// with its request unchanged: the start event in its stream.
		Origin: saga.OriginOf(js, cat),
	})
	require.NoError(t, err)
	runService(t, stock)
	runService(t, carrier)

	place := func(id string) {
		o := shopOrder{OrderID: id, Quantity: 2, Email: id + "@shop.example"}
		o.Address.Street, o.Address.Postcode = "1 rue de la Roquette", shopOrderPostcode
		e, err := events.New("/shop/orders", orderPlaced, id, map[string]any{"trip_id": id, "request": o})
		require.NoError(t, err)
		publishMsg(t, js, e, "", nil)
	}
	pools := map[string]*pgxpool.Pool{"stock": stockPool, "courier": courierPool}
	stepOf := func(service, id, name string) *saga.StepView {
		steps, err := saga.Steps(ctx, pools[service], id)
		if err != nil {
			return nil
		}
		for i := range steps {
			if steps[i].Step == name {
				return &steps[i]
			}
		}
		return nil
	}
	settled := func(pool, id, name, status string) func() bool {
		return func() bool { s := stepOf(pool, id, name); return s != nil && s.Status == status }
	}

	// Whole: reserved, then handed over; the courier got the order's postcode.
	place("O-whole")
	sagatest.Eventually(t, settled("courier", "O-whole", "courier", "done"), "the parcel handed over")
	require.Equal(t, "done", stepOf("stock", "O-whole", "stock").Status)
	require.Equal(t, "held", statusAt(t, warehouse, "O-whole:stock"))
	require.Equal(t, "booked", statusAt(t, courier, "O-whole:courier"))

	// Refused by the courier: the reservation is released by its key.
	require.NoError(t, sim.AddFault(ctx, srv.URL+"/cars", sim.Rule{Op: sim.OpBook, Match: map[string]string{"trip_id": "O-refused"}, Fault: sim.FaultSoldOut}))
	place("O-refused")
	sagatest.Eventually(t, settled("courier", "O-refused", "courier", "rejected"), "the courier refused")
	sagatest.Eventually(t, settled("stock", "O-refused", "stock", "compensated"), "the reservation released")
	require.Equal(t, "released", statusAt(t, warehouse, "O-refused:stock"))

	// The hand-over's answer lost: asked again by key, done once.
	require.NoError(t, sim.AddFault(ctx, srv.URL+"/cars", sim.Rule{Op: sim.OpBook, Match: map[string]string{"trip_id": "O-lost"}, Fault: sim.FaultLoseAnswer, Times: 1}))
	place("O-lost")
	sagatest.Eventually(t, settled("courier", "O-lost", "courier", "done"), "the lost hand-over learned by key")
	require.Equal(t, "booked", statusAt(t, courier, "O-lost:courier"))
	require.Equal(t, "done", stepOf("stock", "O-lost", "stock").Status, "nothing unwound")
}

// statusAt is the company's status word of the record under key.
func statusAt(t *testing.T, c *provider.Client, key string) string {
	t.Helper()
	res, err := c.Status(context.Background(), key)
	require.NoError(t, err)
	return res.Status
}
