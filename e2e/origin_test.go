package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/inbox"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/sagatest"
)

// TestAForgedStepEventIsParkedByItsOrigin (a leaked step seed): signed in
// as the hotel (the seed `tripsaga up` gave the hotel process), a
// well-formed hotel.held with a valid request is published for a trip the
// trips service never took, and another for a real trip with its amount
// changed. The service the catalogue starts on hotel.held (payment;
// insurance with four steps) parks each, saying why (no trip.requested /
// the request differs, naming the field), and calls no company: the card
// processor has no charge on the forged card, and no payment event is
// published for the invented trip.
func TestAForgedStepEventIsParkedByItsOrigin(t *testing.T) {
	ctx := context.Background()
	js, dl, before := deadLetterStream(t)
	hotel, err := sys.ConnectNATS("hotel")
	require.NoError(t, err)
	defer hotel.Close()
	hjs, err := jetstream.New(hotel)
	require.NoError(t, err)

	forge := func(trip string, req events.TripRequest, at time.Time) {
		t.Helper()
		e, err := events.New(events.Source("hotel"), events.HotelHeld, trip, events.StepData{
			TripID: trip, Step: "hotel", IdempotencyKey: trip + ":hotel", CompanyRef: "H-forged", Request: sagatest.JSON(t, req),
		})
		require.NoError(t, err)
		e.SetTime(at)
		h, err := events.EncodeHeaders(e)
		require.NoError(t, err)
		// Well-formed in every way, Nats-Msg-Id included, as the
		// hotel's relay would publish it.
		m := &nats.Msg{Subject: "hotel.held." + trip, Data: e.Data(), Header: nats.Header{"Nats-Msg-Id": {e.ID()}}}
		for k, v := range h {
			m.Header[k] = []string{v}
		}
		_, err = hjs.PublishMsg(ctx, m)
		require.NoError(t, err, "the hotel may publish its own events")
	}

	// A trip nobody asked for, stamped an hour ago: past the origin grace
	// (a missing trip.requested is asked again for the streams' duplicate
	// window and a minute, in case the TRIPS stream lost it; see
	// saga.TestOriginLostByItsStream), so parked at once.
	invented := "T-" + ulid.Make().String()
	card := "tok_forged_" + invented
	var req events.TripRequest
	require.NoError(t, json.Unmarshal([]byte(validTrip), &req))
	req.Payment.CardToken = card
	req.Payment.AmountCents = 99999900
	forge(invented, req, time.Now().Add(-time.Hour))

	// A real trip, its amount changed.
	code, body, _ := post(t, validTrip, map[string]string{"Prefer": "wait=30"})
	require.Equal(t, http.StatusCreated, code)
	real := body["trip_id"].(string)
	var changed events.TripRequest
	require.NoError(t, json.Unmarshal([]byte(validTrip), &changed))
	changed.Payment.AmountCents = 99999900
	forge(real, changed, time.Now())

	parker := triggeredBy(events.HotelHeld)
	found := map[string]string{}
	var viewParked string // the reconciler parks it too (issue 19 item 4)
	testenv.Eventually(t, func() bool {
		info, err := dl.Info(ctx)
		if err != nil {
			return false
		}
		for seq := before.State.LastSeq + 1; seq <= info.State.LastSeq; seq++ {
			msg, err := dl.GetMsg(ctx, seq)
			if err == nil && msg.Header.Get(inbox.HeaderDeadConsumer) == "reconciler" && msg.Header.Get("ce-subject") == invented {
				viewParked = msg.Header.Get(inbox.HeaderDeadReason)
			}
			if err != nil || msg.Header.Get(inbox.HeaderDeadConsumer) != parker {
				continue
			}
			if s := msg.Header.Get("ce-subject"); s == invented || s == real {
				found[s] = msg.Header.Get(inbox.HeaderDeadReason)
			}
		}
		return len(found) == 2 && viewParked != ""
	}, parker+" parks both forged events, the reconciler the invented trip's")
	require.Contains(t, found[invented], "no trip.requested for "+invented+": not a trip the trips service took")
	require.Contains(t, found[real], "request differs from the trip's trip.requested: payment.amount_cents")
	require.Contains(t, viewParked, "no trip.requested for "+invented)
	// The view shows no trip stuck after its hotel that nobody requested.
	resp, err := http.Get(sys.URL("reconciler") + "/view/" + invented)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "the reconciler's view has no row for the invented trip")

	// No charge on the forged card, no payment event for the invented trip.
	resp, err = http.Get(sys.CompanyURLs()["PAYMENTS_URL"] + "/statements/" + url.PathEscape(card))
	require.NoError(t, err)
	var st struct {
		Lines []any `json:"lines"`
	}
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	}
	resp.Body.Close()
	require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, resp.StatusCode)
	require.Empty(t, st.Lines, "no charge for a forged trip")
	for _, name := range []string{events.StreamPayment, events.StreamCar} {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		_, err = s.GetLastMsgForSubject(ctx, "*.*."+invented)
		require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "no %s event for the invented trip", name)
	}
}
