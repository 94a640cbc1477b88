package natsauth_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/process"
)

// violations collects the permission violations the server reports to
// one connection (asynchronously, as -ERR).
type violations struct {
	mu   sync.Mutex
	errs []error
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.errs = append(v.errs, err)
}

// wait returns once the server has reported a violation naming subject.
func (v *violations) wait(t *testing.T, kind, subject string) {
	t.Helper()
	testenv.Eventually(t, func() bool {
		v.mu.Lock()
		defer v.mu.Unlock()
		for _, err := range v.errs {
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(strings.ToLower(err.Error()), kind) && strings.Contains(err.Error(), `"`+subject+`"`) {
				return true
			}
		}
		return false
	}, "no permissions violation for %s to %s (got %v)", kind, subject, v.errs)
}

type conn struct {
	nc *nats.Conn
	js jetstream.JetStream
	v  *violations
}

func connectAs(t *testing.T, srv *server.Server, name string) conn {
	t.Helper()
	v := &violations{}
	nc := testenv.Connect(t, srv, name, nats.ErrorHandler(v.handler))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return conn{nc: nc, js: js, v: v}
}

// system starts a server with every identity and every stream (made by
// admin), and returns it with an admin connection.
func system(t *testing.T) (*server.Server, jetstream.JetStream) {
	t.Helper()
	srv, _, js := testenv.JetStream(t)
	return srv, js
}

func msgs(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// shortCtx bounds a call the server refuses (it answers nothing): the
// refusal itself is the violation waited for.
func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

// The hotel's identity publishes its own events, but a payment.charged it
// forges is refused by the server (no PubAck, a permissions violation),
// never stored, and so never reaches the car's or the trips' consumer.
func TestHotelCannotPublishPaymentCharged(t *testing.T) {
	srv, admin := system(t)
	hotel := connectAs(t, srv, "hotel")
	ctx := context.Background()
	if _, err := hotel.js.Publish(ctx, "hotel.held.T-1", []byte(`{}`)); err != nil {
		t.Fatalf("hotel cannot publish its own hotel.held: %v", err)
	}
	forged := "payment.charged.T-1"
	if ack, err := hotel.js.Publish(shortCtx(t), forged, []byte(`{}`)); err == nil {
		t.Fatalf("hotel published %s: PubAck %+v", forged, ack)
	}
	hotel.v.wait(t, "publish", forged)
	if n := msgs(t, admin, events.StreamPayment); n != 0 {
		t.Fatalf("stream PAYMENT holds %d messages after the forged publish", n)
	}
	// The consumers of payment.charged (car) and of every payment event
	// (trips), created as their own identities, have nothing to deliver.
	for _, svc := range []string{"car", "trips"} {
		c := connectAs(t, srv, svc)
		cons, err := c.js.CreateOrUpdateConsumer(ctx, events.StreamPayment, jetstream.ConsumerConfig{
			Durable: svc, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxDeliver: -1,
		})
		if err != nil {
			t.Fatalf("%s cannot create its own consumer on PAYMENT: %v", svc, err)
		}
		batch, err := cons.FetchNoWait(10)
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			t.Fatalf("%s's consumer got %s", svc, m.Subject())
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending != 0 || info.Delivered.Stream != 0 {
			t.Fatalf("%s's consumer: %d pending, %d delivered", svc, info.NumPending, info.Delivered.Stream)
		}
	}
}

// The hotel's identity creates and deletes its own consumers only: it can
// neither create the payment service's consumer nor delete the car's.
func TestHotelCannotCreateOrDeleteAnotherConsumer(t *testing.T) {
	srv, admin := system(t)
	ctx := context.Background()
	hotel := connectAs(t, srv, "hotel")
	cfg := func(name string) jetstream.ConsumerConfig {
		return jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxDeliver: -1}
	}
	if _, err := hotel.js.CreateOrUpdateConsumer(ctx, events.StreamTrips, cfg("hotel")); err != nil {
		t.Fatalf("hotel cannot create its own consumer: %v", err)
	}
	if _, err := hotel.js.CreateOrUpdateConsumer(shortCtx(t), events.StreamHotel, cfg("payment")); err == nil {
		t.Fatal("hotel created the payment service's consumer on HOTEL")
	}
	hotel.v.wait(t, "publish", "$JS.API.CONSUMER.CREATE.HOTEL.payment")
	if _, err := admin.Consumer(ctx, events.StreamHotel, "payment"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("payment's consumer on HOTEL: %v, want not found", err)
	}
	car := connectAs(t, srv, "car")
	if _, err := car.js.CreateOrUpdateConsumer(ctx, events.StreamPayment, cfg("car")); err != nil {
		t.Fatalf("car cannot create its own consumer: %v", err)
	}
	if err := hotel.js.DeleteConsumer(shortCtx(t), events.StreamPayment, "car"); err == nil {
		t.Fatal("hotel deleted the car's consumer")
	}
	hotel.v.wait(t, "publish", "$JS.API.CONSUMER.DELETE.PAYMENT.car")
	if _, err := admin.Consumer(ctx, events.StreamPayment, "car"); err != nil {
		t.Fatalf("the car's consumer after hotel's delete: %v", err)
	}
	// Nor may it change another service's stream.
	if _, err := hotel.js.UpdateStream(shortCtx(t), jetstream.StreamConfig{Name: events.StreamPayment, Subjects: []string{"payment.>"}, MaxAge: time.Second}); err == nil {
		t.Fatal("hotel updated the PAYMENT stream")
	}
	hotel.v.wait(t, "publish", "$JS.API.STREAM.UPDATE.PAYMENT")
}

// The hotel's identity cannot subscribe to another identity's inbox (where
// JetStream answers the payment service and delivers what it pulls), nor
// to the shared _INBOX.>, nor to the event subjects themselves.
func TestHotelCannotReadAnotherInbox(t *testing.T) {
	srv, _ := system(t)
	hotel := connectAs(t, srv, "hotel")
	nc := testenv.Connect(t, srv, "hotel", nats.PermissionErrOnSubscribe(true))
	for _, subj := range []string{natsauth.InboxPrefix("payment") + ".>", "_INBOX.>", "payment.charged.*", ">"} {
		sub, err := nc.SubscribeSync(subj)
		if err != nil {
			t.Fatal(err)
		}
		_, err = sub.NextMsg(10 * time.Second)
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), `"`+subj+`"`) {
			t.Fatalf("hotel subscribing to %s: %v, want a permissions violation naming it", subj, err)
		}
	}
	// Its own inbox works: a JetStream call answers.
	if _, err := hotel.js.AccountInfo(context.Background()); err != nil {
		t.Fatalf("hotel's own inbox: %v", err)
	}
}

// The reconciler reads every stream but publishes no step event.
func TestReconcilerCannotPublishStepEvents(t *testing.T) {
	srv, admin := system(t)
	rec := connectAs(t, srv, "reconciler")
	var n int
	for _, et := range events.Default.Types {
		if et.Service == "reconciler" {
			continue
		}
		subj := events.Kind(et.Type) + ".T-1"
		if _, err := rec.js.Publish(shortCtx(t), subj, []byte(`{}`)); err == nil {
			t.Fatalf("the reconciler published %s", subj)
		}
		rec.v.wait(t, "publish", subj)
		n++
	}
	if n == 0 {
		t.Fatal("no step event in the catalogue")
	}
	for s := range events.Default.StreamSubjects() {
		if got := msgs(t, admin, s); got != 0 {
			t.Fatalf("stream %s holds %d messages", s, got)
		}
		if _, err := rec.js.Stream(context.Background(), s); err != nil {
			t.Fatalf("the reconciler cannot read stream %s: %v", s, err)
		}
	}
}

// No anonymous client is accepted by the servers the tests start.
func TestAnonymousRefused(t *testing.T) {
	srv, _ := system(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected")
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous connect: %v, want an authorization violation", err)
	}
	// A process without NATS_CREDS is told which variable to set.
	_, err = process.ConnectNATS(process.Env{NATSURL: srv.ClientURL()}, "hotel")
	if err == nil || !strings.Contains(err.Error(), natsauth.EnvCreds) || !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a process without credentials: %v, want an authorization error naming %s", err, natsauth.EnvCreds)
	}
}

// A service started with another service's NATS_CREDS does not start: the
// server refuses it its inbox and its stream, and the error says so at
// the first refusal, naming NATS_CREDS.
func TestServiceWithAnotherIdentityRefused(t *testing.T) {
	srv, _ := testenv.NATSWith(t, nil)
	env := process.Env{
		NATSURL: srv.ClientURL(), DatabaseURL: testenv.Postgres(t), HTTPAddr: "127.0.0.1:0",
		NATSClient: testenv.Client(t, srv, "payment"),
	}
	_, err := process.Open(context.Background(), "hotel", "hotel", env, true)
	if err == nil {
		t.Fatal("the hotel started with the payment's identity")
	}
	for _, want := range []string{"refusing to start", natsauth.EnvCreds, "payment.nk", "permissions violation"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
