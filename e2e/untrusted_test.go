package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
)

// TestAnInvalidRequestInAnEventIsParked: events are untrusted input. A
// well-formed hotel.held whose trip request breaks the API's rules (a
// negative amount, a control character in a name) is parked by the payment
// service on DEADLETTER with the field named, and no company is called for
// it: no charge, no outcome event.
func TestAnInvalidRequestInAnEventIsParked(t *testing.T) {
	ctx := context.Background()
	js, dl, before := deadLetterStream(t)

	cases := map[string]func(r *events.TripRequest){
		"payment.amount_cents": func(r *events.TripRequest) { r.Payment.AmountCents = -500 },
		"traveler.name":        func(r *events.TripRequest) { r.Traveler.Name = "Ada\nBcc: x@evil.example" },
	}
	trips := map[string]string{} // trip -> field
	for field, spoil := range cases {
		trip := "T-" + ulid.Make().String()
		trips[trip] = field
		req := events.TripRequest{
			Traveler: events.Person{Name: "Ada Example", Email: "ada@example.com"},
			Hotel:    events.HotelRequest{PropertyID: "P-100", CheckIn: "2026-12-30", Nights: 2},
			Car:      events.CarRequest{CarClass: "compact", Pickup: "2026-12-30", Return: "2027-01-01"},
			Payment:  events.PaymentRequest{CardToken: "tok_forged_" + trip, AmountCents: 33000, Currency: "USD"},
		}
		spoil(&req)
		e, err := events.New(events.Source("hotel"), events.HotelHeld, trip, map[string]any{"trip_id": trip, "step": "hotel", "request": req})
		require.NoError(t, err)
		h, err := events.EncodeHeaders(e)
		require.NoError(t, err)
		// No Nats-Msg-Id: what a forger or a broken producer sends.
		m := &nats.Msg{Subject: "hotel.held." + trip, Data: e.Data(), Header: nats.Header{}}
		for k, v := range h {
			m.Header[k] = []string{v}
		}
		_, err = js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}

	// The service the catalogue starts on hotel.held (payment; insurance
	// with four steps) parks each, naming the field.
	parker := triggeredBy(events.HotelHeld)
	found := map[string]string{}
	testenv.Eventually(t, func() bool {
		info, err := dl.Info(ctx)
		if err != nil {
			return false
		}
		for seq := before.State.LastSeq + 1; seq <= info.State.LastSeq; seq++ {
			msg, err := dl.GetMsg(ctx, seq)
			if err != nil || msg.Header.Get(inbox.HeaderDeadConsumer) != parker {
				continue
			}
			for trip := range trips {
				if msg.Header.Get("ce-subject") == trip {
					found[trip] = msg.Header.Get(inbox.HeaderDeadReason)
				}
			}
		}
		return len(found) == len(trips)
	}, parker+" parks both events")
	for trip, field := range trips {
		require.Contains(t, found[trip], field, "the reason names the field")
		require.Contains(t, found[trip], "invalid trip request")
		// No charge was made for it, and no outcome event published.
		var st struct {
			Lines []any `json:"lines"`
		}
		resp, err := http.Get(sys.CompanyURLs()["PAYMENTS_URL"] + "/statements/" + url.PathEscape("tok_forged_"+trip))
		require.NoError(t, err)
		code := resp.StatusCode
		if code == http.StatusOK {
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
		}
		resp.Body.Close()
		require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, code)
		require.Empty(t, st.Lines, "no charge for a parked event")
		msgs, err := js.Stream(ctx, events.StreamPayment)
		require.NoError(t, err)
		_, err = msgs.GetLastMsgForSubject(ctx, "payment.*."+trip)
		require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "no payment event for it")
	}
}

// deadLetterStream connects to the system's JetStream (closed at the test's
// end) and returns it, the DEADLETTER stream and its state before the test.
func deadLetterStream(t *testing.T) (jetstream.JetStream, jetstream.Stream, *jetstream.StreamInfo) {
	t.Helper()
	ctx := context.Background()
	nc, err := sys.ConnectNATS(natsauth.Admin)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	dl, err := js.Stream(ctx, events.StreamDeadLetter)
	require.NoError(t, err)
	before, err := dl.Info(ctx)
	require.NoError(t, err)
	return js, dl, before
}

// TestEventDataNotJSONIsParkedByTheReconciler: a CloudEvent whose
// attributes are in order but whose data is not JSON is parked by the
// reconciler on DEADLETTER with why, and never projected (no view of its
// trip), like every other consumer of it.
func TestEventDataNotJSONIsParkedByTheReconciler(t *testing.T) {
	ctx := context.Background()
	js, dl, before := deadLetterStream(t)
	trip := "T-" + ulid.Make().String()
	e, err := events.New(events.Source("hotel"), events.HotelHeld, trip, map[string]any{"trip_id": trip})
	require.NoError(t, err)
	h, err := events.EncodeHeaders(e)
	require.NoError(t, err)
	m := &nats.Msg{Subject: "hotel.held." + trip, Data: []byte(`{"trip_id": "` + trip + `",`), Header: nats.Header{}}
	for k, v := range h {
		m.Header[k] = []string{v}
	}
	_, err = js.PublishMsg(ctx, m)
	require.NoError(t, err)

	var reason string
	testenv.Eventually(t, func() bool {
		info, err := dl.Info(ctx)
		if err != nil {
			return false
		}
		for seq := before.State.LastSeq + 1; seq <= info.State.LastSeq; seq++ {
			msg, err := dl.GetMsg(ctx, seq)
			if err == nil && msg.Header.Get(inbox.HeaderDeadConsumer) == "reconciler" && msg.Header.Get("ce-subject") == trip {
				reason = msg.Header.Get(inbox.HeaderDeadReason)
				return true
			}
		}
		return false
	}, "the reconciler parks it")
	require.Contains(t, reason, "not valid JSON")
	resp, err := http.Get(sys.URL("reconciler") + "/view/" + trip)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "nothing projected for it")
}
