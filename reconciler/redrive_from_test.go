package reconciler

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/process"
)

type redriveAnswer struct {
	code    int
	header  http.Header
	plan    RedrivePlan
	problem process.Problem
}

func postRedrive(t *testing.T, base, tok, key, trip string, body any) redriveAnswer {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, base+"/api/trips/"+url.PathEscape(trip)+"/redrive", bytes.NewReader(raw))
	require.NoError(t, err)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	a := redriveAnswer{code: resp.StatusCode, header: resp.Header}
	if resp.StatusCode/100 == 2 {
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&a.plan))
	} else {
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&a.problem))
	}
	return a
}

func (b *bundle) actionRows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM operator_actions").Scan(&n))
	return n
}

// handledByReconciler counts the actions among ids the reconciler's
// operator inbox has handled (its inbox rows).
func (b *bundle) handledByReconciler(t *testing.T, ids []string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM inbox WHERE consumer = $1 AND event_id = ANY($2)", ProjectionName, ids).Scan(&n))
	return n
}

// Issue 20 item 3: a trip whose projection lost the events from the car
// on (their inbox rows and their part of trip_view gone, the trip left
// pending) is re-driven from the payment step: a dry run lists every
// delivery and records nothing; the re-drive records one action a
// delivery, all under the request's key; the projection handles the events
// it lacks and drops, by event id, those it had (trip_view counts each
// event once); the same key again records nothing more; another re-drive
// acts nothing twice.
func TestRedriveFromAStep(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.start(t)
	_, base := b.operatorServer(t, testToken)
	ctx := context.Background()
	trip := "T-FROM-1"
	var evs []event.Event
	for _, typ := range []string{events.TripRequested, events.HotelHeld, events.PaymentCharged, events.CarBooked, events.TripConfirmed, events.MailSent} {
		e := ev(t, typ, trip)
		// The default order whatever STEPS the suite runs with: the
		// trip's version, not the reconciler's, says what its steps are.
		events.SetVersion(&e, events.DefaultVersion())
		b.publish(t, e, "")
		evs = append(evs, e)
	}
	// A stand-in for the payment service's inbox on HOTEL (no service
	// runs here): re-drives of hotel.held are handed to it too.
	_, err := b.js.CreateOrUpdateConsumer(ctx, events.StreamHotel, jetstream.ConsumerConfig{
		Durable: "payment", FilterSubjects: []string{"hotel.held.>"}, AckPolicy: jetstream.AckExplicitPolicy,
	})
	require.NoError(t, err)
	testenv.Eventually(t, b.caughtUp, "projection caught up")
	v, _ := b.viewOf(t, trip)
	require.Equal(t, "confirmed", v.Status)
	require.Equal(t, 6, v.Events)

	// The projection "never handled" car.booked, trip.confirmed, mail.sent.
	lost := []string{evs[3].ID(), evs[4].ID(), evs[5].ID()}
	_, err = b.pool.Exec(ctx, "DELETE FROM inbox WHERE consumer = $1 AND event_id = ANY($2)", ProjectionName, lost)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE trip_view SET seen = ARRAY['hotel.held','payment.charged','trip.requested'], status = 'pending',
		settled = NULL, mailed = false, events = 3 WHERE trip_id = $1`, trip)
	require.NoError(t, err)
	v, _ = b.viewOf(t, trip)
	require.Equal(t, "pending", v.Status)

	type want struct{ kind, stream, id, consumer string }
	wanted := []want{
		{"hotel.held", events.StreamHotel, evs[1].ID(), "payment"},
		{"hotel.held", events.StreamHotel, evs[1].ID(), ProjectionName},
		{"payment.charged", events.StreamPayment, evs[2].ID(), ProjectionName},
		{"car.booked", events.StreamCar, evs[3].ID(), ProjectionName},
		{"trip.confirmed", events.StreamTrips, evs[4].ID(), ProjectionName},
		{"mail.sent", events.StreamTrips, evs[5].ID(), ProjectionName},
	}
	same := func(t *testing.T, got []RedriveDelivery) {
		t.Helper()
		var g []want
		for _, d := range got {
			g = append(g, want{d.Kind, d.Stream, d.EventID, d.Consumer})
			require.NotZero(t, d.Seq)
		}
		require.Equal(t, wanted, g, "the step's trigger and everything after, to each consumer, in stream order")
	}

	t.Run("BadRequestsNameTheField", func(t *testing.T) {
		body := map[string]any{"step": "payment", "operator": "ada", "reason": "projection lost rows"}
		with := func(k string, v any) map[string]any {
			m := map[string]any{}
			for kk, vv := range body {
				m[kk] = vv
			}
			if v == nil {
				delete(m, k)
			} else {
				m[k] = v
			}
			return m
		}
		for _, c := range []struct {
			trip, key string
			body      any
			field     string
		}{
			{trip, "k-bad", with("step", "billing"), "step"},
			{trip, "", map[string]any{"step": "billing", "dry_run": true}, "step"},
			{trip, "k-bad", with("step", nil), "step"},
			{trip, "k-bad", with("reason", nil), "reason"},
			{trip, "k-bad", with("operator", " "), "operator"},
			{trip, "", body, "Idempotency-Key"},
			{"x y", "k-bad", body, "trip"},
			{trip, "k-bad", with("colour", "red"), "colour"},
			{trip, "k-bad", with("trip", "T-OTHER"), "trip"},
			// insurance is a step of some version, not of this trip's.
			{trip, "k-bad", with("step", "insurance"), "step"},
		} {
			a := postRedrive(t, base, testToken, c.key, c.trip, c.body)
			require.Equal(t, http.StatusBadRequest, a.code, "%v: %s", c.body, a.problem.Detail)
			require.Len(t, a.problem.Errors, 1)
			require.Equal(t, c.field, a.problem.Errors[0].Field, a.problem.Detail)
		}
		a := postRedrive(t, base, testToken, "k-bad", trip, with("step", "insurance"))
		require.Contains(t, a.problem.Detail, "has no step")
		a = postRedrive(t, base, "", "", "T-NO-EVENTS", map[string]any{"step": "payment", "dry_run": true})
		require.Equal(t, http.StatusNotFound, a.code, a.problem.Detail)
		a = postRedrive(t, base, "wrong", "k-auth", trip, body)
		require.Equal(t, http.StatusUnauthorized, a.code)
		require.Zero(t, b.actionRows(t), "nothing recorded for a refused re-drive")
	})

	t.Run("DryRunRecordsNothing", func(t *testing.T) {
		a := postRedrive(t, base, "", "", trip, map[string]any{"step": "payment", "dry_run": true})
		require.Equal(t, http.StatusOK, a.code, a.problem.Detail)
		require.True(t, a.plan.DryRun)
		require.Equal(t, events.DefaultVersion(), a.plan.Version)
		same(t, a.plan.Deliveries)
		require.Empty(t, a.plan.Actions)
		for _, d := range a.plan.Deliveries {
			require.Empty(t, d.ActionID)
		}
		// The trips service and the car consume some of them, but no
		// durable consumer of theirs exists here: listed as skipped.
		var skipped []string
		for _, s := range a.plan.Skipped {
			skipped = append(skipped, s.Consumer+" "+s.Kind)
			require.Contains(t, s.Why, "no durable consumer")
		}
		require.Contains(t, skipped, "car payment.charged")
		require.Contains(t, skipped, "trips car.booked")
		require.Zero(t, b.actionRows(t))
		v, _ := b.viewOf(t, trip)
		require.Equal(t, "pending", v.Status, "a dry run changes nothing")
	})

	redrive := map[string]any{"step": "payment", "operator": "ada", "reason": "projection lost rows"}
	var first RedrivePlan
	t.Run("RedriveHandlesWhatWasNeverHandled", func(t *testing.T) {
		a := postRedrive(t, base, testToken, "k-from-payment", trip, redrive)
		require.Equal(t, http.StatusAccepted, a.code, a.problem.Detail)
		first = a.plan
		same(t, first.Deliveries)
		require.Len(t, first.Actions, len(wanted))
		for i, d := range first.Deliveries {
			require.Equal(t, first.Actions[i], d.ActionID)
		}
		require.Equal(t, len(wanted), b.actionRows(t))

		// The reconciler's operator inbox takes every action (carrying out
		// its own, acknowledging the others).
		testenv.Eventually(t, func() bool { return b.handledByReconciler(t, first.Actions) == len(first.Actions) }, "the reconciler carried out its re-drives")
		v, _ := b.viewOf(t, trip)
		require.Equal(t, "confirmed", v.Status)
		require.Equal(t, []string{"car.booked", "hotel.held", "mail.sent", "payment.charged", "trip.confirmed", "trip.requested"}, v.Seen)
		require.Equal(t, 6, v.Events, "hotel.held and payment.charged, handled already, dropped by the inbox")

		// On the OPERATOR stream, each a redrive of a stored event (Seq 0).
		testenv.Eventually(t, func() bool { return len(b.operatorMsgs(t, trip)) == len(wanted) }, "the actions published")
		var toPayment events.OperatorActionData
		for _, e := range b.operatorMsgs(t, trip) {
			var d events.OperatorActionData
			require.NoError(t, e.DataAs(&d))
			require.Equal(t, events.ActionRedrive, d.Action)
			require.Equal(t, "redrive from payment: projection lost rows", d.Reason)
			require.Equal(t, "k-from-payment", d.IdempotencyKey)
			require.Zero(t, d.DeadLetter.Seq)
			if d.Service == "payment" {
				toPayment = d
			}
		}
		require.Equal(t, events.StreamHotel, toPayment.DeadLetter.Stream)
		require.Equal(t, "payment", toPayment.DeadLetter.Consumer)
		require.Equal(t, first.Deliveries[0].Seq, toPayment.DeadLetter.StreamSeq)
		parked, err := events.Decode(toPayment.DeadLetter.Headers, toPayment.DeadLetter.Data)
		require.NoError(t, err)
		require.Equal(t, evs[1].ID(), parked.ID())
	})

	t.Run("TheSameKeyRecordsOnce", func(t *testing.T) {
		a := postRedrive(t, base, testToken, "k-from-payment", trip, redrive)
		require.Equal(t, http.StatusAccepted, a.code, a.problem.Detail)
		require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
		require.True(t, a.plan.Replayed)
		require.Equal(t, first.Actions, a.plan.Actions)
		same(t, a.plan.Deliveries)
		require.Equal(t, len(wanted), b.actionRows(t))

		other := postRedrive(t, base, testToken, "k-from-payment", trip, map[string]any{"step": "car", "operator": "ada", "reason": "x"})
		require.Equal(t, http.StatusConflict, other.code)
		require.Contains(t, other.problem.Detail, "another re-drive")
		act := postAction(t, base, testToken, "k-from-payment", map[string]any{"action": "pause", "trip": trip, "service": "payment", "reason": "x", "operator": "ada"})
		require.Equal(t, http.StatusConflict, act.code, "the key of a re-drive is no key for another action")
		require.Contains(t, act.problem.Detail, "re-drive")
		require.Equal(t, len(wanted), b.actionRows(t))
	})

	t.Run("AnotherRedriveActsNothingTwice", func(t *testing.T) {
		var before int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM inbox WHERE consumer = $1", ProjectionName).Scan(&before))
		a := postRedrive(t, base, testToken, "k-from-payment-2", trip, redrive)
		require.Equal(t, http.StatusAccepted, a.code, a.problem.Detail)
		ids := a.plan.Actions
		require.Len(t, ids, len(wanted))
		testenv.Eventually(t, func() bool { return b.handledByReconciler(t, ids) == len(ids) }, "the reconciler carried out its re-drives")
		var after int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM inbox WHERE consumer = $1", ProjectionName).Scan(&after))
		require.Equal(t, before+len(ids), after, "only the action events' own inbox rows: every re-driven event was a duplicate")
		v, _ := b.viewOf(t, trip)
		require.Equal(t, 6, v.Events)
		require.Equal(t, "confirmed", v.Status)
	})

	t.Run("FromTheCarLeavesTheEarlierStepsOut", func(t *testing.T) {
		a := postRedrive(t, base, "", "", trip, map[string]any{"step": "car", "dry_run": true})
		require.Equal(t, http.StatusOK, a.code, a.problem.Detail)
		var kinds []string
		for _, d := range a.plan.Deliveries {
			kinds = append(kinds, d.Kind)
		}
		require.Equal(t, "payment.charged car.booked trip.confirmed mail.sent", strings.Join(kinds, " "))
	})
}

// redriveTypes follows the trip's version: the step's triggers in that
// order, what it and the later steps publish, and from a saga step the
// undos of the earlier ones; never an operator's action.
func TestRedriveTypes(t *testing.T) {
	t.Parallel()
	chargeLast, err := events.CatalogueOf(events.ChargeLast)
	require.NoError(t, err)
	insured, err := events.CatalogueOf(events.FullSteps)
	require.NoError(t, err)
	for _, c := range []struct {
		name      string
		c         events.Catalogue
		step      string
		has, lack []string
	}{
		{"DefaultPayment", events.Default, "payment",
			[]string{events.HotelHeld, events.PaymentCharged, events.PaymentRefunded, events.CarBooked, events.CarRejected, events.HotelReleased, events.TripConfirmed, events.TripCanceled, events.MailSent},
			[]string{events.TripRequested, events.OperatorAction}},
		{"DefaultMail", events.Default, "mail",
			[]string{events.TripConfirmed, events.TripCanceled, events.MailSent, events.TripCancellationRequested},
			[]string{events.HotelHeld, events.PaymentCharged, events.HotelReleased, events.CarBooked}},
		{"ChargeLastCar", chargeLast, "car",
			[]string{events.HotelHeld, events.CarBooked, events.CarCanceled, events.PaymentCharged, events.HotelReleased},
			[]string{events.TripRequested}},
		{"InsuredPayment", insured, "payment",
			[]string{events.InsuranceBought, events.PaymentCharged, events.InsuranceCanceled, events.HotelReleased},
			[]string{events.HotelHeld, events.TripRequested}},
		{"UnknownStep", events.Default, "insurance", nil, []string{events.HotelHeld}},
	} {
		got := redriveTypes(c.c, c.step)
		for _, typ := range c.has {
			require.Contains(t, got, typ, c.name)
		}
		for _, typ := range c.lack {
			require.NotContains(t, got, typ, c.name)
		}
	}
}

func TestSubjectMatches(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"hotel.held.>", "hotel.held.T-1", true},
		{"hotel.held.>", "hotel.held", false},
		{"hotel.>", "hotel.held.T-1", true},
		{"hotel.*.T-1", "hotel.held.T-1", true},
		{"hotel.*", "hotel.held.T-1", false},
		{"payment.charged.>", "hotel.held.T-1", false},
		{"hotel.held.T-1", "hotel.held.T-1", true},
	} {
		require.Equal(t, c.want, subjectMatches(c.filter, c.subject), "%s %s", c.filter, c.subject)
	}
}
