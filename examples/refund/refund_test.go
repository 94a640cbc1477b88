package refund_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/examples/refund"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/sagatest"
	"github.com/tripsaga/tripsaga/sim"
)

func TestMain(m *testing.M) { sagatest.Main(m) }

// timing is quick to retry but never times a call out on a loaded
// machine (a 10 s call deadline; a step deadline far past the test), so
// every unknown outcome in these tests is the one a fault makes.
var timing = saga.Timing{
	CallTimeout: 10 * time.Second, StepDeadline: 2 * time.Minute,
	RetryBackoffMin: 20 * time.Millisecond, RetryBackoffMax: 200 * time.Millisecond,
	UndoBackoffMin: 20 * time.Millisecond, UndoBackoffMax: 200 * time.Millisecond,
	PollInterval: 50 * time.Millisecond,
}

// world is the refund saga running on real infrastructure: one private
// PostgreSQL database with a schema per service, an embedded JetStream
// with the saga's streams, the simulators as the companies over real
// HTTP, the four step services and the refunds desk's view.
type world struct {
	ctx   context.Context
	js    jetstream.JetStream
	nc    *nats.Conn
	url   string // the simulators' base URL
	cos   refund.Companies
	pools map[string]*pgxpool.Pool
	view  *refund.View
}

func start(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	cat := refund.Catalogue()
	require.NoError(t, cat.Validate())
	dbURL := sagatest.Postgres(t)
	pools := map[string]*pgxpool.Pool{}
	for _, s := range []string{refund.ServiceHold, refund.ServiceInventory, refund.ServiceCredit, refund.ServiceReply, refund.ServiceRefunds} {
		pools[s] = sagatest.PoolAt(t, dbURL, s, sagatest.MachinerySet)
	}
	sims, err := sim.New(ctx, sim.Config{DatabaseURL: dbURL})
	require.NoError(t, err)
	srv := httptest.NewServer(sims.Handler())
	t.Cleanup(func() { srv.Close(); sims.Close() })
	_, nc, js := sagatest.JetStream(t, cat)
	w := &world{ctx: ctx, js: js, nc: nc, url: srv.URL, cos: refund.SimCompanies(srv.URL), pools: pools}
	svcs, err := refund.Services(refund.Config{JetStream: js, Pools: pools, Companies: w.cos, Timing: timing})
	require.NoError(t, err)
	w.view, err = refund.NewView(ctx, pools[refund.ServiceRefunds], js)
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, len(svcs)+1)
	for _, s := range svcs {
		go func() { _ = s.Run(rctx, nil); done <- struct{}{} }()
	}
	go func() { _ = w.view.Run(rctx); done <- struct{}{} }()
	t.Cleanup(func() {
		cancel()
		for range len(svcs) + 1 {
			<-done
		}
	})
	return w
}

// refundOf is the refund of order id: three items, 25.90 EUR.
func refundOf(id string) refund.Refund {
	return refund.Refund{
		OrderID: id, Items: []refund.Item{{SKU: "MUG-1", Quantity: 2}, {SKU: "TEA-9", Quantity: 1}},
		AmountCents: 2_590, Currency: "EUR", Email: id + "@customer.example",
	}
}

// request has the refunds desk take order id's refund (its row and
// refund.requested in one transaction, published by its relay).
func (w *world) request(t *testing.T, id string) {
	t.Helper()
	require.NoError(t, w.view.Take(w.ctx, refundOf(id)))
}

// fault adds a rule to the simulated company at path ("/payments") and
// returns its id.
func (w *world) fault(t *testing.T, path string, r sim.Rule) string {
	t.Helper()
	got, err := sim.AddFaultRule(w.ctx, w.url+path, r)
	require.NoError(t, err)
	return got.ID
}

// applied is how many requests the company at path applied rule id to.
func (w *world) applied(t *testing.T, path, id string) int {
	t.Helper()
	rules, err := sim.ListFaults(w.ctx, w.url+path)
	require.NoError(t, err)
	for _, r := range rules {
		if r.ID == id {
			return r.Applied
		}
	}
	t.Fatalf("no rule %s at %s", id, path)
	return 0
}

// step is the step log's row of step for refund id (saga.Steps), nil
// when there is none yet.
func (w *world) step(id, name string) *saga.StepView {
	steps, err := saga.Steps(w.ctx, w.pools[name], id)
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

func (w *world) status(id, name string) string {
	if s := w.step(id, name); s != nil {
		return s.Status
	}
	return ""
}

// waitState waits until the view says id is at state.
func (w *world) waitState(t *testing.T, id string, state refund.State) {
	t.Helper()
	sagatest.Eventually(t, func() bool {
		s, err := w.view.StateOf(w.ctx, id)
		return err == nil && s == state
	}, "%s: the view never says %s", id, state)
}

// records returns the company's records of refund id, all statuses.
func records(t *testing.T, c *provider.Client, id string) []provider.Record {
	t.Helper()
	all, err := c.List(context.Background(), "")
	require.NoError(t, err)
	var out []provider.Record
	for _, r := range all {
		if r.TripID() == id {
			out = append(out, r)
		}
	}
	return out
}

// one asserts the company holds exactly one record of refund id, under
// key, at status.
func one(t *testing.T, c *provider.Client, id, key, status string) {
	t.Helper()
	rs := records(t, c, id)
	require.Len(t, rs, 1, "%s: one record at %s", id, c.Company)
	require.Equal(t, key, rs[0].Key())
	require.Equal(t, status, rs[0].Status())
}

// TestRefundSaga runs refunds through the saga on the machinery (issue
// 18): one whole, one refused at each step, one whose reply's company
// fails for a while, one whose credit's answer is lost. Each is asserted
// against the companies' own records, the step log and the view.
func TestRefundSaga(t *testing.T) {
	w := start(t)
	c := w.cos

	// Faults, set before any request so each meets its refund's first call.
	w.fault(t, "/hotel", sim.Rule{Op: sim.OpHold, Match: map[string]string{"trip_id": "R-hold-refused"}, Fault: sim.FaultSoldOut})
	w.fault(t, "/cars", sim.Rule{Op: sim.OpBook, Match: map[string]string{"trip_id": "R-return-refused"}, Fault: sim.FaultSoldOut})
	w.fault(t, "/payments", sim.Rule{Op: sim.OpCharge, Match: map[string]string{"trip_id": "R-credit-refused"}, Fault: sim.FaultDeclined})
	w.fault(t, "/mail", sim.Rule{Op: sim.OpMessage, Match: map[string]string{"trip_id": "R-reply-late"}, Fault: sim.FaultFail, Times: 4})
	lost := w.fault(t, "/payments", sim.Rule{Op: sim.OpCharge, Match: map[string]string{"trip_id": "R-credit-lost"}, Fault: sim.FaultLoseAnswer, Times: 1})
	ids := []string{"R-whole", "R-hold-refused", "R-return-refused", "R-credit-refused", "R-reply-late", "R-credit-lost"}
	for _, id := range ids {
		w.request(t, id)
	}

	t.Run("whole", func(t *testing.T) {
		id := "R-whole"
		w.waitState(t, id, refund.StateReplied)
		// The desk takes an order once: the same request again is a
		// no-op, another one is refused.
		require.NoError(t, w.view.Take(w.ctx, refundOf(id)))
		other := refundOf(id)
		other.AmountCents++
		require.ErrorIs(t, w.view.Take(w.ctx, other), refund.ErrTaken)
		st, err := w.view.StateOf(w.ctx, id)
		require.NoError(t, err)
		require.Equal(t, refund.StateReplied, st)
		for _, s := range []string{"hold", "inventory", "credit", "reply"} {
			require.Equal(t, "done", w.status(id, s), s)
		}
		one(t, c.Holds, id, id+":hold", "held")
		one(t, c.Returns, id, id+":inventory", "booked")
		one(t, c.Credits, id, id+":credit", "charged")
		require.Equal(t, "201 charged", w.step(id, "credit").Outcome, "the credit's own answer")
		sent := records(t, c.Replies, id)
		require.Len(t, sent, 1, "one reply")
		require.Equal(t, id+":reply", sent[0].Key())
		require.Equal(t, id+"@customer.example", sent[0]["to"])
		require.Contains(t, sent[0]["text"], "25.90 EUR")
	})

	t.Run("hold refused: nothing to undo", func(t *testing.T) {
		id := "R-hold-refused"
		w.waitState(t, id, refund.StateCanceled)
		require.Equal(t, "rejected", w.status(id, "hold"))
		for _, s := range []string{"inventory", "credit", "reply"} {
			require.Nil(t, w.step(id, s), "%s never asked", s)
		}
		require.Empty(t, records(t, c.Holds, id))
		require.Empty(t, records(t, c.Returns, id))
		require.Empty(t, records(t, c.Credits, id))
		require.Empty(t, records(t, c.Replies, id))
	})

	t.Run("inventory refused: the hold released", func(t *testing.T) {
		id := "R-return-refused"
		w.waitState(t, id, refund.StateCanceled)
		require.Equal(t, "rejected", w.status(id, "inventory"))
		require.Equal(t, "compensated", w.status(id, "hold"))
		one(t, c.Holds, id, id+":hold", "released")
		require.Empty(t, records(t, c.Returns, id))
		require.Nil(t, w.step(id, "credit"))
		require.Empty(t, records(t, c.Credits, id))
		require.Empty(t, records(t, c.Replies, id))
	})

	t.Run("credit refused: taken back out, then the hold released", func(t *testing.T) {
		id := "R-credit-refused"
		w.waitState(t, id, refund.StateCanceled)
		require.Equal(t, "rejected", w.status(id, "credit"))
		inv, hold := w.step(id, "inventory"), w.step(id, "hold")
		require.Equal(t, "compensated", inv.Status)
		require.Equal(t, "compensated", hold.Status)
		one(t, c.Returns, id, id+":inventory", "canceled")
		one(t, c.Holds, id, id+":hold", "released")
		// Newest first: the hold's release is asked for by the
		// take-back's own event, so it is written down after it.
		require.NotNil(t, inv.UndoneAt)
		require.NotNil(t, hold.UndoneAt)
		require.False(t, hold.UndoneAt.Before(*inv.UndoneAt), "the hold released after the items were taken back out")
		one(t, c.Credits, id, id+":credit", "declined")
		require.Nil(t, w.step(id, "reply"), "no reply step: the view's canceled is what the desk tells")
	})

	t.Run("reply's company failing: retried until sent, nothing undone", func(t *testing.T) {
		id := "R-reply-late"
		w.waitState(t, id, refund.StateReplied)
		r := w.step(id, "reply")
		require.Equal(t, "done", r.Status)
		require.GreaterOrEqual(t, r.Attempts, 5, "four 5xx answers, then the one that sent it")
		require.Len(t, records(t, c.Replies, id), 1, "sent once")
		for _, s := range []string{"hold", "inventory", "credit"} {
			require.Equal(t, "done", w.status(id, s), "%s not undone after the pivot", s)
		}
		one(t, c.Holds, id, id+":hold", "held")
		one(t, c.Returns, id, id+":inventory", "booked")
		one(t, c.Credits, id, id+":credit", "charged")
	})

	t.Run("credit's answer lost: learned by key, credited once, never undone", func(t *testing.T) {
		id := "R-credit-lost"
		w.waitState(t, id, refund.StateReplied)
		require.Equal(t, "done", w.status(id, "credit"))
		// The company committed the credit and lost its answer; the
		// same key was sent again (by the runner, or by net/http's
		// Transport, which resends a request carrying an Idempotency-Key
		// on a connection lost before any answer) and the first answer
		// replayed: one record, charged once.
		require.Equal(t, 1, w.applied(t, "/payments", lost), "the answer was lost once")
		one(t, c.Credits, id, id+":credit", "charged")
		for _, s := range []string{"hold", "inventory"} {
			require.Equal(t, "done", w.status(id, s), "%s not undone", s)
		}
		one(t, c.Holds, id, id+":hold", "held")
		one(t, c.Returns, id, id+":inventory", "booked")
	})
}

// TestRefundForgedTrigger: a trigger another step service published is
// carried out only for a refund the desk took, with the same request
// (saga.OriginOf reads refund.requested in the REFUNDS stream). A forged
// inventory.returned asking for a larger credit is parked in the
// dead-letter stream, naming the field that differs, and the credit is
// issued once, for the amount the desk took.
func TestRefundForgedTrigger(t *testing.T) {
	w := start(t)
	id := "R-forged"
	w.request(t, id)
	// refund.requested is in its stream once the hold step was asked.
	sagatest.Eventually(t, func() bool { return w.step(id, "hold") != nil }, "the hold asked")
	forged := refundOf(id)
	forged.AmountCents = 990_000
	e, err := events.New("/inventory", refund.InventoryReturned, id, events.StepData{
		TripID: id, Step: "inventory", IdempotencyKey: id + ":inventory", Request: mustJSON(t, forged),
	})
	require.NoError(t, err)
	h, err := events.EncodeHeaders(e)
	require.NoError(t, err)
	subject, err := events.Subject(e.Type(), id)
	require.NoError(t, err)
	m := &nats.Msg{Subject: subject, Data: e.Data(), Header: nats.Header{}}
	for k, v := range h {
		m.Header.Set(k, v)
	}
	_, err = w.js.PublishMsg(w.ctx, m)
	require.NoError(t, err)

	dlq, err := w.js.Stream(w.ctx, events.StreamDeadLetter)
	require.NoError(t, err)
	var reason string
	sagatest.Eventually(t, func() bool {
		msg, err := dlq.GetLastMsgForSubject(w.ctx, events.DeadLetterSubjectPrefix+"."+refund.StreamInventory+"."+refund.ServiceCredit)
		if err != nil {
			return false
		}
		reason = msg.Header.Get(inbox.HeaderDeadReason)
		return true
	}, "the forged trigger parked")
	require.Contains(t, reason, "amount_cents")

	w.waitState(t, id, refund.StateReplied)
	one(t, w.cos.Credits, id, id+":credit", "charged")
	res, err := w.cos.Credits.StatusFor(w.ctx, id+":credit", map[string]any{"amount_cents": 2_590, "currency": "EUR"})
	require.NoError(t, err, "the credit is the amount the desk took")
	require.Equal(t, "charged", res.Status)
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// TestRefundValidate: a refund that breaks a rule is refused before any
// event is made, naming each field.
func TestRefundValidate(t *testing.T) {
	_, err := refund.NewRequested(refund.Refund{OrderID: "R.1", Items: []refund.Item{{Quantity: 0}}, Currency: "eur", Email: "nobody"})
	require.True(t, errors.Is(err, refund.ErrInvalidRefund))
	for _, f := range []string{"order_id", "items[0].sku", "items[0].quantity", "amount_cents", "currency", "email"} {
		require.ErrorContains(t, err, f)
	}
	_, err = refund.NewRequested(refund.Refund{OrderID: "R-1", Currency: "EUR", AmountCents: 1, Email: "a@b.example"})
	require.ErrorContains(t, err, "items must name at least one item")
}
