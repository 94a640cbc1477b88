package sim

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHealthz(t *testing.T) {
	t.Parallel()
	b := setup(t)
	status, body := call(t, http.MethodGet, b.srv.URL+"/healthz", "", nil)
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, `{"status":"ok"}`, body)
}

func TestNewRequiresDatabaseURL(t *testing.T) {
	t.Parallel()
	_, err := New(context.Background(), Config{})
	require.ErrorContains(t, err, "DatabaseURL")
}

func TestHotel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hotel := b.company("hotel")

	t.Run("ReplaySameKeySameBody", func(t *testing.T) {
		t.Parallel()
		status, first := call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusCreated, status, first)
		m := decode(t, first)
		require.Equal(t, "T-1:hotel", m["key"])
		require.True(t, strings.HasPrefix(m["hold_id"].(string), "H-"), m["hold_id"])
		require.Equal(t, "T-1", m["trip_id"])
		require.Equal(t, "held", m["status"])
		require.Equal(t, "P-7", m["property_id"])
		require.Equal(t, "2026-07-01", m["check_in"])
		require.EqualValues(t, 2, m["nights"])
		require.Equal(t, map[string]any{"name": "Ada Lovelace", "email": "ada@example.com"}, m["guest"])

		status, again := call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, first, again)

		list, _ := items(t, hotel+"/holds?status=held")
		held := 0
		for _, it := range list {
			if it.(map[string]any)["key"] == "T-1:hotel" {
				held++
			}
		}
		require.Equal(t, 1, held)

		status, got := call(t, http.MethodGet, hotel+"/holds/T-1:hotel", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, m["hold_id"], decode(t, got)["hold_id"])
	})

	t.Run("KeyReusedWithOtherBody", func(t *testing.T) {
		t.Parallel()
		status, _ := call(t, http.MethodPost, hotel+"/holds", "T-2:hotel", holdBody("T-2"))
		require.Equal(t, http.StatusCreated, status)
		other := holdBody("T-2")
		other["nights"] = 3
		status, body := call(t, http.MethodPost, hotel+"/holds", "T-2:hotel", other)
		require.Equal(t, http.StatusUnprocessableEntity, status)
		require.JSONEq(t, `{"error":"idempotency_key_reused"}`, body)
		_, got := call(t, http.MethodGet, hotel+"/holds/T-2:hotel", "", nil)
		require.EqualValues(t, 2, decode(t, got)["nights"])
	})

	t.Run("SameBodyOtherKeyOrder", func(t *testing.T) {
		t.Parallel()
		status, first := call(t, http.MethodPost, hotel+"/holds", "T-3:hotel", holdBody("T-3"))
		require.Equal(t, http.StatusCreated, status)
		// Same fields, other order and spacing: the same canonical body.
		raw := `{ "nights":2, "guest":{"email":"ada@example.com","name":"Ada Lovelace"}, "check_in":"2026-07-01","property_id":"P-7","trip_id":"T-3"}`
		status, again := call(t, http.MethodPost, hotel+"/holds", "T-3:hotel", raw)
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, first, again)
	})

	t.Run("MissingIdempotencyKey", func(t *testing.T) {
		t.Parallel()
		status, body := call(t, http.MethodPost, hotel+"/holds", "", holdBody("T-4"))
		require.Equal(t, http.StatusUnprocessableEntity, status)
		require.Contains(t, decode(t, body)["error"], "Idempotency-Key")
	})

	t.Run("Validation", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name  string
			edit  func(m map[string]any)
			field string
		}{
			{"NoTrip", func(m map[string]any) { delete(m, "trip_id") }, "trip_id"},
			{"NightsZero", func(m map[string]any) { m["nights"] = 0 }, "nights"},
			{"NightsFraction", func(m map[string]any) { m["nights"] = 1.5 }, "nights"},
			{"BadDate", func(m map[string]any) { m["check_in"] = "2026-13-01" }, "check_in"},
			{"NoGuestEmail", func(m map[string]any) { delete(m["guest"].(map[string]any), "email") }, "guest.email"},
			{"GuestNotObject", func(m map[string]any) { m["guest"] = "Ada" }, "guest.name"},
		} {
			body := holdBody("T-5")
			tc.edit(body)
			status, out := call(t, http.MethodPost, hotel+"/holds", "T-5:"+tc.name, body)
			require.Equal(t, http.StatusUnprocessableEntity, status, tc.name)
			require.Contains(t, decode(t, out)["error"], tc.field, tc.name)
		}
		status, out := call(t, http.MethodPost, hotel+"/holds", "T-5:json", `{"trip_id":`)
		require.Equal(t, http.StatusUnprocessableEntity, status)
		require.Contains(t, decode(t, out)["error"], "body")
		status, _ = call(t, http.MethodGet, hotel+"/holds/T-5:NoTrip", "", nil)
		require.Equal(t, http.StatusNotFound, status)
	})

	t.Run("UndoUnknownKeyIsNone", func(t *testing.T) {
		t.Parallel()
		for range 2 {
			status, body := call(t, http.MethodPost, hotel+"/holds/T-6:hotel/release", "", nil)
			require.Equal(t, http.StatusOK, status)
			require.JSONEq(t, `{"status":"none"}`, body)
		}
		status, body := call(t, http.MethodGet, hotel+"/holds/T-6:hotel", "", nil)
		require.Equal(t, http.StatusNotFound, status)
		require.JSONEq(t, `{"status":"none"}`, body)
	})

	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		_, created := call(t, http.MethodPost, hotel+"/holds", "T-7:hotel", holdBody("T-7"))
		holdID := decode(t, created)["hold_id"]
		status, first := call(t, http.MethodPost, hotel+"/holds/T-7:hotel/release", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.JSONEq(t, fmt.Sprintf(`{"key":"T-7:hotel","hold_id":%q,"status":"released"}`, holdID), first)
		status, again := call(t, http.MethodPost, hotel+"/holds/T-7:hotel/release", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, first, again)
		_, got := call(t, http.MethodGet, hotel+"/holds/T-7:hotel", "", nil)
		require.Equal(t, "released", decode(t, got)["status"])
		// The replay of the creating POST is still the first answer.
		status, replay := call(t, http.MethodPost, hotel+"/holds", "T-7:hotel", holdBody("T-7"))
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, created, replay)
	})

	t.Run("ConcurrentSameKeyOneRecord", func(t *testing.T) {
		t.Parallel()
		const n = 12
		var wg sync.WaitGroup
		bodies := make([]string, n)
		statuses := make([]int, n)
		for i := range n {
			wg.Go(func() {
				s, out, err := send(t, client(0), http.MethodPost, hotel+"/holds", "T-8:hotel", holdBody("T-8"))
				if err == nil {
					statuses[i], bodies[i] = s, out
				}
			})
		}
		wg.Wait()
		for i := range n {
			require.Equal(t, http.StatusCreated, statuses[i])
			require.Equal(t, bodies[0], bodies[i])
		}
		list, _ := items(t, hotel+"/holds?trip_id=T-8")
		require.Len(t, list, 1)
	})
}

func TestPayments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pay := b.company("payments")

	t.Run("ChargeReplayOneStatementLine", func(t *testing.T) {
		t.Parallel()
		status, first := call(t, http.MethodPost, pay+"/charges", "T-1:charge", chargeBody("T-1", "tok_1", 12500))
		require.Equal(t, http.StatusCreated, status, first)
		m := decode(t, first)
		require.Equal(t, "T-1:charge", m["key"])
		require.True(t, strings.HasPrefix(m["charge_id"].(string), "C-"))
		require.Equal(t, "charged", m["status"])
		require.EqualValues(t, 12500, m["amount_cents"])
		require.Equal(t, "EUR", m["currency"])
		status, again := call(t, http.MethodPost, pay+"/charges", "T-1:charge", chargeBody("T-1", "tok_1", 12500))
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, first, again)
		_, st := call(t, http.MethodGet, pay+"/statements/tok_1", "", nil)
		lines := decode(t, st)["lines"].([]any)
		require.Len(t, lines, 1)
		require.Equal(t, "charge", lines[0].(map[string]any)["kind"])
	})

	t.Run("RefundAddsLineKeepsCharge", func(t *testing.T) {
		t.Parallel()
		_, created := call(t, http.MethodPost, pay+"/charges", "T-2:charge", chargeBody("T-2", "tok_2", 9900))
		chargeID := decode(t, created)["charge_id"]
		status, first := call(t, http.MethodPost, pay+"/charges/T-2:charge/refund", "", nil)
		require.Equal(t, http.StatusOK, status)
		m := decode(t, first)
		require.Equal(t, "T-2:charge", m["key"])
		require.Equal(t, "refunded", m["status"])
		require.True(t, strings.HasPrefix(m["refund_id"].(string), "R-"))
		status, again := call(t, http.MethodPost, pay+"/charges/T-2:charge/refund", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, first, again)

		_, st := call(t, http.MethodGet, pay+"/statements/tok_2", "", nil)
		lines := decode(t, st)["lines"].([]any)
		require.Len(t, lines, 2)
		for i, kind := range []string{"charge", "refund"} {
			l := lines[i].(map[string]any)
			require.Equal(t, kind, l["kind"])
			require.Equal(t, "T-2", l["trip_id"])
			require.EqualValues(t, 9900, l["amount_cents"])
			require.NotEmpty(t, l["at"])
		}
		_, got := call(t, http.MethodGet, pay+"/charges/T-2:charge", "", nil)
		g := decode(t, got)
		require.Equal(t, "refunded", g["status"])
		require.Equal(t, chargeID, g["charge_id"])
		require.Equal(t, m["refund_id"], g["refund_id"])
	})

	t.Run("DeclinedCardToken", func(t *testing.T) {
		t.Parallel()
		status, first := call(t, http.MethodPost, pay+"/charges", "T-3:charge", chargeBody("T-3", DeclinedCardToken, 500))
		require.Equal(t, http.StatusPaymentRequired, status)
		require.JSONEq(t, `{"status":"declined","reason":"card declined"}`, first)
		status, again := call(t, http.MethodPost, pay+"/charges", "T-3:charge", chargeBody("T-3", DeclinedCardToken, 500))
		require.Equal(t, http.StatusPaymentRequired, status)
		require.Equal(t, first, again)

		status, got := call(t, http.MethodGet, pay+"/charges/T-3:charge", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "declined", decode(t, got)["status"])

		for range 2 {
			status, body := call(t, http.MethodPost, pay+"/charges/T-3:charge/refund", "", nil)
			require.Equal(t, http.StatusOK, status)
			require.JSONEq(t, `{"status":"none"}`, body)
		}
		_, st := call(t, http.MethodGet, pay+"/statements/"+DeclinedCardToken, "", nil)
		require.JSONEq(t, `{"lines":[]}`, st)

		list, _ := items(t, pay+"/charges?status=declined&trip_id=T-3")
		require.Len(t, list, 1)
		list, _ = items(t, pay+"/charges?status=charged&trip_id=T-3")
		require.Empty(t, list)
	})

	t.Run("Validation", func(t *testing.T) {
		t.Parallel()
		for field, edit := range map[string]func(m map[string]any){
			"currency":     func(m map[string]any) { m["currency"] = "eur" },
			"amount_cents": func(m map[string]any) { m["amount_cents"] = 12.5 },
			"card_token":   func(m map[string]any) { m["card_token"] = "" },
		} {
			body := chargeBody("T-4", "tok_4", 100)
			edit(body)
			status, out := call(t, http.MethodPost, pay+"/charges", "T-4:"+field, body)
			require.Equal(t, http.StatusUnprocessableEntity, status, field)
			require.Contains(t, decode(t, out)["error"], field)
		}
	})
}

func TestCars(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cars := b.company("cars")

	status, created := call(t, http.MethodPost, cars+"/bookings", "T-1:car", bookingBody("T-1", "ada@example.com"))
	require.Equal(t, http.StatusCreated, status, created)
	m := decode(t, created)
	require.Equal(t, "booked", m["status"])
	require.True(t, strings.HasPrefix(m["booking_id"].(string), "B-"))
	require.Equal(t, "compact", m["car_class"])

	status, canceled := call(t, http.MethodPost, cars+"/bookings/T-1:car/cancel", "", nil)
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, fmt.Sprintf(`{"key":"T-1:car","booking_id":%q,"status":"canceled"}`, m["booking_id"]), canceled)

	status, body := call(t, http.MethodPost, cars+"/bookings/T-404:car/cancel", "", nil)
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, `{"status":"none"}`, body)

	list, _ := items(t, cars+"/bookings?status=canceled")
	require.Len(t, list, 1)

	bad := bookingBody("T-2", "ada@example.com")
	bad["return"] = "2026-06-30"
	status, body = call(t, http.MethodPost, cars+"/bookings", "T-2:car", bad)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Contains(t, decode(t, body)["error"], "return")
}

func TestMail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mail := b.company("mail")

	status, first := call(t, http.MethodPost, mail+"/messages", "T-1:mail:confirmed", messageBody("T-1"))
	require.Equal(t, http.StatusAccepted, status, first)
	m := decode(t, first)
	require.Len(t, m, 3)
	require.Equal(t, "T-1:mail:confirmed", m["key"])
	require.Equal(t, "queued", m["status"])
	require.True(t, strings.HasPrefix(m["message_id"].(string), "M-"))

	status, again := call(t, http.MethodPost, mail+"/messages", "T-1:mail:confirmed", messageBody("T-1"))
	require.Equal(t, http.StatusAccepted, status)
	require.Equal(t, first, again)

	_, _ = call(t, http.MethodPost, mail+"/messages", "T-2:mail:confirmed", messageBody("T-2"))

	list, next := items(t, mail+"/messages?trip_id=T-1")
	require.Len(t, list, 1)
	require.Empty(t, next)
	msg := list[0].(map[string]any)
	require.Equal(t, "ada@example.com", msg["to"])
	require.Equal(t, "Trip T-1 confirmed", msg["subject"])

	status, got := call(t, http.MethodGet, mail+"/messages/T-1:mail:confirmed", "", nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, m["message_id"], decode(t, got)["message_id"])

	bad := messageBody("T-3")
	bad["to"] = "nobody"
	status, body := call(t, http.MethodPost, mail+"/messages", "T-3:mail", bad)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Contains(t, decode(t, body)["error"], "to")
}

func TestListPaging(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hotel := b.company("hotel")
	for i := range 5 {
		trip := fmt.Sprintf("T-%d", i)
		status, _ := call(t, http.MethodPost, hotel+"/holds", trip+":hotel", holdBody(trip))
		require.Equal(t, http.StatusCreated, status)
	}
	_, _ = call(t, http.MethodPost, hotel+"/holds/T-1:hotel/release", "", nil)

	var trips []string
	url := hotel + "/holds?limit=2"
	pages := 0
	for {
		list, next := items(t, url)
		pages++
		for _, it := range list {
			trips = append(trips, it.(map[string]any)["trip_id"].(string))
		}
		if next == "" {
			require.Len(t, list, 1)
			break
		}
		require.Len(t, list, 2)
		url = hotel + "/holds?limit=2&after=" + next
	}
	require.Equal(t, 3, pages)
	require.Equal(t, []string{"T-0", "T-1", "T-2", "T-3", "T-4"}, trips)

	list, next := items(t, hotel+"/holds")
	require.Len(t, list, 5)
	require.Empty(t, next)

	list, _ = items(t, hotel+"/holds?status=held")
	require.Len(t, list, 4)
	list, _ = items(t, hotel+"/holds?status=released")
	require.Len(t, list, 1)

	// Exactly limit items left: no next.
	list, next = items(t, hotel+"/holds?limit=5")
	require.Len(t, list, 5)
	require.Empty(t, next)

	for _, q := range []string{"limit=1001", "limit=0", "limit=x", "after=abc", "status=bogus"} {
		status, body := call(t, http.MethodGet, hotel+"/holds?"+q, "", nil)
		require.Equal(t, http.StatusUnprocessableEntity, status, q)
		require.Contains(t, decode(t, body)["error"], strings.Split(q, "=")[0], q)
	}
	list, _ = items(t, hotel+"/holds?limit=1000")
	require.Len(t, list, 5)
}

func TestRecordsSurviveRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, hold := call(t, http.MethodPost, b.company("hotel")+"/holds", "T-1:hotel", holdBody("T-1"))
	_, charge := call(t, http.MethodPost, b.company("payments")+"/charges", "T-1:charge", chargeBody("T-1", "tok_r", 700))
	status, _ := call(t, http.MethodPost, b.company("payments")+"/charges/T-1:charge/refund", "", nil)
	require.Equal(t, http.StatusOK, status)
	b.sims.Close()

	b2 := setupOn(t, b.dbURL)
	status, replay := call(t, http.MethodPost, b2.company("hotel")+"/holds", "T-1:hotel", holdBody("T-1"))
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, hold, replay)
	status, got := call(t, http.MethodGet, b2.company("payments")+"/charges/T-1:charge", "", nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "refunded", decode(t, got)["status"])
	require.Equal(t, decode(t, charge)["charge_id"], decode(t, got)["charge_id"])
	_, st := call(t, http.MethodGet, b2.company("payments")+"/statements/tok_r", "", nil)
	require.Len(t, decode(t, st)["lines"], 2)
}
