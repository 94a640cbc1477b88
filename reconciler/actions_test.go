package reconciler

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/process"
)

const testToken = "s3cret-operator-token"

// operatorServer runs an Operator (token tok) of b's reconciler behind an
// HTTP server until the test ends.
func (b *bundle) operatorServer(t *testing.T, tok string) (*Operator, string) {
	t.Helper()
	op, err := NewOperator(OperatorConfig{Reconciler: b.r, Token: tok})
	require.NoError(t, err)
	mux := http.NewServeMux()
	op.Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = op.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return op, hs.URL
}

type answer struct {
	code    int
	header  http.Header
	problem process.Problem
	event   event.Event
}

func postAction(t *testing.T, base, tok, key string, body any) answer {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, base+"/api/actions", bytes.NewReader(raw))
	require.NoError(t, err)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	a := answer{code: resp.StatusCode, header: resp.Header}
	if resp.StatusCode == http.StatusAccepted {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&a.event))
	} else {
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&a.problem))
	}
	return a
}

// operatorMsgs returns the action events stored on the OPERATOR stream
// about trip.
func (b *bundle) operatorMsgs(t *testing.T, trip string) []event.Event {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, events.StreamOperator)
	require.NoError(t, err)
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"operator.action." + trip}})
	require.NoError(t, err)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	var out []event.Event
	for range info.NumPending {
		m, err := c.Next()
		require.NoError(t, err)
		e, err := events.Decode(m.Headers(), m.Data())
		require.NoError(t, err)
		out = append(out, e)
	}
	return out
}

func TestActionsAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, base := b.operatorServer(t, testToken)
	trip := "T-ACTIONS-1"
	retry := map[string]any{"action": "retry_undo", "trip": trip, "service": "payment", "reason": "card processor is back", "operator": "ada"}

	t.Run("DisabledWithoutToken", func(t *testing.T) {
		_, off := b.operatorServer(t, "")
		a := postAction(t, off, testToken, "k-off", retry)
		require.Equal(t, http.StatusServiceUnavailable, a.code)
		require.Contains(t, a.problem.Detail, OperatorTokenEnv)
	})
	t.Run("NeedsTheToken", func(t *testing.T) {
		for _, tok := range []string{"", "wrong", testToken + "x"} {
			a := postAction(t, base, tok, "k-auth", retry)
			require.Equal(t, http.StatusUnauthorized, a.code, "token %q", tok)
			require.Contains(t, a.header.Get("WWW-Authenticate"), "Bearer")
		}
	})
	t.Run("BadInputNamesTheField", func(t *testing.T) {
		with := func(k string, v any) map[string]any {
			m := map[string]any{}
			for kk, vv := range retry {
				m[kk] = vv
			}
			if v == nil {
				delete(m, k)
			} else {
				m[k] = v
			}
			return m
		}
		cases := []struct {
			key   string
			body  any
			field string
		}{
			{"", retry, "Idempotency-Key"},
			{"k-bad", with("action", "reboot"), "action"},
			{"k-bad", with("reason", nil), "reason"},
			{"k-bad", with("operator", "  "), "operator"},
			{"k-bad", with("trip", "not a trip"), "trip"},
			{"k-bad", with("service", "mail"), "service"},
			{"k-bad", with("incident", "compensation_stuck"), "incident"},
			{"k-bad", with("deadletter_seq", "three"), "deadletter_seq"},
			{"k-bad", with("colour", "red"), "colour"},
			{"k-bad", map[string]any{"action": "redrive", "reason": "fixed", "operator": "ada"}, "deadletter_seq"},
		}
		for _, c := range cases {
			a := postAction(t, base, testToken, c.key, c.body)
			require.Equal(t, http.StatusBadRequest, a.code, "%v", c.body)
			require.Len(t, a.problem.Errors, 1)
			require.Equal(t, c.field, a.problem.Errors[0].Field, a.problem.Detail)
			require.Contains(t, a.problem.Detail, c.field)
		}
		// Issue 19 item 5: a trip id with a space was answered
		// "trip: required"; a 2 MB body 400 "unexpected EOF".
		a := postAction(t, base, testToken, "k-bad", with("trip", "x y"))
		require.Equal(t, http.StatusBadRequest, a.code)
		require.Contains(t, a.problem.Errors[0].Detail, `"x y" is not a trip id`)
		big := with("reason", strings.Repeat("r", 2<<20))
		a = postAction(t, base, testToken, "k-big", big)
		require.Equal(t, http.StatusRequestEntityTooLarge, a.code, a.problem.Detail)
		require.Contains(t, a.problem.Detail, "at most")
		require.Empty(t, b.operatorMsgs(t, trip), "nothing published for a refused action")
	})
	t.Run("ADoubleSubmitActsOnce", func(t *testing.T) {
		first := postAction(t, base, testToken, "k-retry-1", retry)
		require.Equal(t, http.StatusAccepted, first.code, first.problem.Detail)
		require.Equal(t, events.OperatorAction, first.event.Type())
		require.Equal(t, trip, first.event.Subject())
		var d events.OperatorActionData
		require.NoError(t, first.event.DataAs(&d))
		require.Equal(t, events.OperatorActionData{Action: "retry_undo", TripID: trip, Service: "payment",
			Reason: "card processor is back", Operator: "ada", IdempotencyKey: "k-retry-1"}, d)

		again := postAction(t, base, testToken, "k-retry-1", retry)
		require.Equal(t, http.StatusAccepted, again.code)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, first.event.ID(), again.event.ID())

		testenv.Eventually(t, func() bool { return len(b.operatorMsgs(t, trip)) == 1 }, "the action published")
		got := b.operatorMsgs(t, trip)
		require.Len(t, got, 1, "one event for two submits")
		require.Equal(t, first.event.ID(), got[0].ID())

		other := postAction(t, base, testToken, "k-retry-1", map[string]any{"action": "pause", "trip": trip, "service": "payment", "reason": "x", "operator": "ada"})
		require.Equal(t, http.StatusConflict, other.code)
		require.Contains(t, other.problem.Detail, "another action")

		resp, err := http.Get(base + "/api/actions?trip=" + trip)
		require.NoError(t, err)
		defer resp.Body.Close()
		var list struct{ Items []event.Event }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
		require.Len(t, list.Items, 1)
		require.Equal(t, first.event.ID(), list.Items[0].ID())
	})
	t.Run("UndoLeakNeedsAFinding", func(t *testing.T) {
		a := postAction(t, base, testToken, "k-leak", map[string]any{"action": "undo_leak", "trip": trip, "service": "hotel", "reason": "orphan hold", "operator": "ada"})
		require.Equal(t, http.StatusConflict, a.code)
		require.Contains(t, a.problem.Detail, "no open orphan or half finding")
	})
	t.Run("RedriveOfAMissingDeadLetterIs404", func(t *testing.T) {
		a := postAction(t, base, testToken, "k-dl-404", map[string]any{"action": "redrive", "deadletter_seq": 4242, "reason": "fixed", "operator": "ada"})
		require.Equal(t, http.StatusNotFound, a.code)
	})
}

// park stores e on the dead-letter stream as consumer would have parked
// it from stream at seq, and returns its DEADLETTER sequence.
func (b *bundle) park(t *testing.T, e event.Event, stream, consumer string, seq uint64, reason string) uint64 {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, events.EnsureStreams(ctx, b.js, events.Default))
	m := msgOf(t, e)
	dl := &nats.Msg{Subject: events.DeadLetterSubjectPrefix + "." + stream + "." + consumer, Data: m.Data, Header: m.Header}
	dl.Header.Set(inbox.HeaderDeadReason, reason)
	dl.Header.Set(inbox.HeaderDeadStream, stream)
	dl.Header.Set(inbox.HeaderDeadSeq, strconv.FormatUint(seq, 10))
	dl.Header.Set(inbox.HeaderDeadSubject, m.Subject)
	dl.Header.Set(inbox.HeaderDeadConsumer, consumer)
	ack, err := b.js.PublishMsg(ctx, dl)
	require.NoError(t, err)
	return ack.Sequence
}

func TestRedriveIntoTheReconcilerOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.start(t)
	_, base := b.operatorServer(t, testToken)
	trip := "T-REDRIVE-1"
	e := ev(t, events.HotelHeld, trip)
	seq := b.park(t, e, events.StreamHotel, ProjectionName, 77, "still failing after 25 deliveries: boom")
	// One parked by another consumer, left alone.
	other := b.park(t, ev(t, events.HotelHeld, "T-REDRIVE-2"), events.StreamHotel, "payment", 78, "boom")

	resp, err := http.Get(base + "/api/deadletters")
	require.NoError(t, err)
	var list struct{ Items []DeadLetter }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	resp.Body.Close()
	require.Len(t, list.Items, 2)
	dl := list.Items[0]
	require.Equal(t, seq, dl.Seq)
	require.Equal(t, ProjectionName, dl.Consumer)
	require.Equal(t, events.StreamHotel, dl.Stream)
	require.Equal(t, uint64(77), dl.StreamSeq)
	require.Equal(t, trip, dl.TripID)
	require.Equal(t, events.HotelHeld, dl.Type)
	require.Equal(t, e.ID(), dl.EventID)
	require.Contains(t, dl.Reason, "boom")
	require.Empty(t, dl.RedrivenBy)
	require.Equal(t, other, list.Items[1].Seq)

	_, found := b.viewOf(t, trip)
	require.False(t, found)
	a := postAction(t, base, testToken, "k-redrive", map[string]any{"action": "redrive", "deadletter_seq": seq, "reason": "projection fixed", "operator": "ada"})
	require.Equal(t, http.StatusAccepted, a.code, a.problem.Detail)
	var d events.OperatorActionData
	require.NoError(t, a.event.DataAs(&d))
	require.Equal(t, ProjectionName, d.Service)
	require.Equal(t, trip, d.TripID)

	testenv.Eventually(t, func() bool { _, ok := b.viewOf(t, trip); return ok }, "the re-driven event applied")
	v, _ := b.viewOf(t, trip)
	require.Equal(t, []string{"hotel.held"}, v.Seen)
	var rows int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM inbox WHERE event_id = $1", e.ID()).Scan(&rows))
	require.Equal(t, 1, rows, "only the consumer that parked it got it")

	resp, err = http.Get(base + "/api/deadletters/" + strconv.FormatUint(seq, 10))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&dl))
	require.Equal(t, []string{a.event.ID()}, dl.RedrivenBy)
}

// settle is refused for a step the events do not show stuck, and a step
// is settled once: a retry with the same key replays, another key is 409.
func TestSettleAction(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.start(t)
	_, base := b.operatorServer(t, testToken)
	trip, done := "T-SETTLE-1", "T-SETTLE-2"
	b.publishAll(t, trip, events.TripRequested, events.HotelHeld, events.PaymentCharged, events.CarRejected, events.PaymentRefundStuck, events.HotelReleased)
	b.publishAll(t, done, events.TripRequested, events.HotelHeld, events.PaymentCharged, events.CarRejected, events.PaymentRefundStuck, events.PaymentRefunded)
	testenv.Eventually(t, b.caughtUp, "projection caught up")
	settle := func(service, outcome string) map[string]any {
		return map[string]any{"action": "settle", "trip": trip, "service": service, "outcome": outcome, "reason": "refunded by hand, ticket 7", "operator": "ada"}
	}

	a := postAction(t, base, testToken, "k-s-0", settle("payment", ""))
	require.Equal(t, http.StatusBadRequest, a.code)
	require.Equal(t, "outcome", a.problem.Errors[0].Field)
	require.Contains(t, a.problem.Detail, "undone, done, not_done")
	a = postAction(t, base, testToken, "k-s-0", map[string]any{"action": "retry_undo", "trip": trip, "service": "payment", "outcome": "undone", "reason": "x", "operator": "ada"})
	require.Equal(t, http.StatusBadRequest, a.code)
	require.Equal(t, "outcome", a.problem.Errors[0].Field, "outcome only for settle")
	a = postAction(t, base, testToken, "k-s-0", settle("hotel", "undone"))
	require.Equal(t, http.StatusConflict, a.code)
	require.Contains(t, a.problem.Detail, "the undo of step hotel of trip T-SETTLE-1 is done already (hotel.released seen)")
	a = postAction(t, base, testToken, "k-s-0", map[string]any{"action": "settle", "trip": done, "service": "payment", "outcome": "undone", "reason": "x", "operator": "ada"})
	require.Equal(t, http.StatusConflict, a.code)
	require.Contains(t, a.problem.Detail, "is done already (payment.refunded seen)")
	a = postAction(t, base, testToken, "k-s-0", map[string]any{"action": "settle", "trip": done, "service": "hotel", "outcome": "undone", "reason": "x", "operator": "ada"})
	require.Equal(t, http.StatusConflict, a.code)
	require.Contains(t, a.problem.Detail, "the undo of step hotel of trip T-SETTLE-2 is not stuck (no hotel.release_stuck seen")
	require.Empty(t, b.operatorMsgs(t, trip), "nothing published for a refused settle")

	first := postAction(t, base, testToken, "k-s-1", settle("payment", "undone"))
	require.Equal(t, http.StatusAccepted, first.code, first.problem.Detail)
	var d events.OperatorActionData
	require.NoError(t, first.event.DataAs(&d))
	require.Equal(t, events.OperatorActionData{Action: "settle", TripID: trip, Service: "payment", Outcome: "undone", Step: "payment",
		Reason: "refunded by hand, ticket 7", Operator: "ada", IdempotencyKey: "k-s-1"}, d)
	again := postAction(t, base, testToken, "k-s-1", settle("payment", "undone"))
	require.Equal(t, http.StatusAccepted, again.code, again.problem.Detail)
	require.Equal(t, first.event.ID(), again.event.ID(), "the same key replays the settle")
	second := postAction(t, base, testToken, "k-s-2", func() map[string]any { m := settle("payment", "undone"); m["step"] = "payment"; return m }())
	require.Equal(t, http.StatusConflict, second.code)
	require.Contains(t, second.problem.Detail, "step payment of trip T-SETTLE-1 was settled already (undone, by ada at ")
	require.Contains(t, second.problem.Detail, "a step is settled once")
	testenv.Eventually(t, func() bool { return len(b.operatorMsgs(t, trip)) == 1 }, "the settle published once")
}
