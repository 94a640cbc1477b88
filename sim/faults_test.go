package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
)

func TestFaults(t *testing.T) {
	t.Parallel()

	t.Run("SoldOutIsStoredButNoRecord", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hotel := b.company("hotel")
		addFault(t, hotel, Rule{Op: OpHold, Fault: FaultSoldOut, Times: 1})

		status, first := call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusConflict, status)
		require.JSONEq(t, `{"status":"sold_out"}`, first)
		status, again := call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusConflict, status)
		require.Equal(t, first, again)
		status, _ = call(t, http.MethodGet, hotel+"/holds/T-1:hotel", "", nil)
		require.Equal(t, http.StatusNotFound, status)
		status, body := call(t, http.MethodPost, hotel+"/holds/T-1:hotel/release", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.JSONEq(t, `{"status":"none"}`, body)
		list, _ := items(t, hotel+"/holds")
		require.Empty(t, list)

		// Times 1: the next new key is held.
		status, _ = call(t, http.MethodPost, hotel+"/holds", "T-2:hotel", holdBody("T-2"))
		require.Equal(t, http.StatusCreated, status)

		rules, err := ListFaults(context.Background(), hotel)
		require.NoError(t, err)
		require.Len(t, rules, 1)
		require.Equal(t, 1, rules[0].Applied)
	})

	t.Run("SoldOutMatchesDottedPath", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cars := b.company("cars")
		addFault(t, cars, Rule{Op: OpBook, Fault: FaultSoldOut, Match: map[string]string{"driver.email": "late@example.com"}})
		status, _ := call(t, http.MethodPost, cars+"/bookings", "T-1:car", bookingBody("T-1", "late@example.com"))
		require.Equal(t, http.StatusConflict, status)
		status, _ = call(t, http.MethodPost, cars+"/bookings", "T-2:car", bookingBody("T-2", "ada@example.com"))
		require.Equal(t, http.StatusCreated, status)
		status, _ = call(t, http.MethodPost, cars+"/bookings", "T-3:car", bookingBody("T-3", "late@example.com"))
		require.Equal(t, http.StatusConflict, status)
	})

	t.Run("Declined", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pay := b.company("payments")
		addFault(t, pay, Rule{Op: OpCharge, Fault: FaultDeclined, Match: map[string]string{"card_token": "tok_x"}})
		status, body := call(t, http.MethodPost, pay+"/charges", "T-1:charge", chargeBody("T-1", "tok_x", 100))
		require.Equal(t, http.StatusPaymentRequired, status)
		require.JSONEq(t, `{"status":"declined","reason":"card declined"}`, body)
		_, got := call(t, http.MethodGet, pay+"/charges/T-1:charge", "", nil)
		require.Equal(t, "declined", decode(t, got)["status"])
		status, _ = call(t, http.MethodPost, pay+"/charges", "T-2:charge", chargeBody("T-2", "tok_y", 100))
		require.Equal(t, http.StatusCreated, status)
	})

	t.Run("MatchOnNumber", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pay := b.company("payments")
		status, body := call(t, http.MethodPost, pay+"/_faults", "",
			`{"op":"charge","fault":"declined","match":{"amount_cents":666}}`)
		require.Equal(t, http.StatusCreated, status, body)
		require.Equal(t, map[string]any{"amount_cents": "666"}, decode(t, body)["match"])
		status, _ = call(t, http.MethodPost, pay+"/charges", "T-1:charge", chargeBody("T-1", "tok_1", 666))
		require.Equal(t, http.StatusPaymentRequired, status)
		status, _ = call(t, http.MethodPost, pay+"/charges", "T-2:charge", chargeBody("T-2", "tok_1", 667))
		require.Equal(t, http.StatusCreated, status)
	})

	t.Run("FailForMSThenSucceeds", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hotel := b.company("hotel")
		addFault(t, hotel, Rule{Op: OpHold, Fault: FaultFail, ForMS: 300})
		status, body := call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusServiceUnavailable, status)
		require.JSONEq(t, `{"error":"unavailable"}`, body)
		status, _ = call(t, http.MethodGet, hotel+"/holds/T-1:hotel", "", nil)
		require.Equal(t, http.StatusNotFound, status)

		testenv.Eventually(t, func() bool {
			status, _ := call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
			if status == http.StatusServiceUnavailable {
				return false
			}
			require.Equal(t, http.StatusCreated, status)
			return true
		}, "hold never succeeded after the failure window")
		list, _ := items(t, hotel+"/holds")
		require.Len(t, list, 1)
	})

	t.Run("FailOnUndoMatchesOriginalRequest", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pay := b.company("payments")
		for _, trip := range []string{"T-1", "T-2"} {
			status, _ := call(t, http.MethodPost, pay+"/charges", trip+":charge", chargeBody(trip, "tok_"+trip, 100))
			require.Equal(t, http.StatusCreated, status)
		}
		addFault(t, pay, Rule{Op: OpRefund, Fault: FaultFail, Times: 2, Match: map[string]string{"trip_id": "T-1"}})
		for range 2 {
			status, _ := call(t, http.MethodPost, pay+"/charges/T-1:charge/refund", "", nil)
			require.Equal(t, http.StatusServiceUnavailable, status)
		}
		_, got := call(t, http.MethodGet, pay+"/charges/T-1:charge", "", nil)
		require.Equal(t, "charged", decode(t, got)["status"])
		_, st := call(t, http.MethodGet, pay+"/statements/tok_T-1", "", nil)
		require.Len(t, decode(t, st)["lines"], 1)

		// Another key's request does not match.
		status, body := call(t, http.MethodPost, pay+"/charges/T-2:charge/refund", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "refunded", decode(t, body)["status"])
		// Times used up: the refund goes through.
		status, body = call(t, http.MethodPost, pay+"/charges/T-1:charge/refund", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "refunded", decode(t, body)["status"])
	})

	t.Run("LoseAnswerThenReplay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hotel := b.company("hotel")
		addFault(t, hotel, Rule{Op: OpHold, Fault: FaultLoseAnswer, Times: 1})
		_, _, err := send(t, client(30*time.Second), http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Error(t, err)

		status, got := call(t, http.MethodGet, hotel+"/holds/T-1:hotel", "", nil)
		require.Equal(t, http.StatusOK, status)
		status, replay := call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, decode(t, got)["hold_id"], decode(t, replay)["hold_id"])
		list, _ := items(t, hotel+"/holds")
		require.Len(t, list, 1)
	})

	t.Run("LoseAnswerOnRefund", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pay := b.company("payments")
		status, _ := call(t, http.MethodPost, pay+"/charges", "T-1:charge", chargeBody("T-1", "tok_1", 100))
		require.Equal(t, http.StatusCreated, status)
		addFault(t, pay, Rule{Op: OpRefund, Fault: FaultLoseAnswer, Times: 1})
		_, _, err := send(t, client(30*time.Second), http.MethodPost, pay+"/charges/T-1:charge/refund", "", nil)
		require.Error(t, err)
		status, body := call(t, http.MethodPost, pay+"/charges/T-1:charge/refund", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "refunded", decode(t, body)["status"])
		_, st := call(t, http.MethodGet, pay+"/statements/tok_1", "", nil)
		require.Len(t, decode(t, st)["lines"], 2)
	})

	t.Run("HangUntilClientGivesUp", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hotel := b.company("hotel")
		addFault(t, hotel, Rule{Op: OpHold, Fault: FaultHang, Times: 1})
		_, _, err := send(t, client(200*time.Millisecond), http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Error(t, err)
		status, _ := call(t, http.MethodGet, hotel+"/holds/T-1:hotel", "", nil)
		require.Equal(t, http.StatusNotFound, status)
		// Nothing was stored under the key: a retry performs it.
		status, _ = call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusCreated, status)
	})

	t.Run("HangEndsAfterDelay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cars := b.company("cars")
		addFault(t, cars, Rule{Op: OpBook, Fault: FaultHang, DelayMS: 100})
		status, body := call(t, http.MethodPost, cars+"/bookings", "T-1:car", bookingBody("T-1", "ada@example.com"))
		require.Equal(t, http.StatusGatewayTimeout, status)
		require.JSONEq(t, `{"error":"timeout"}`, body)
		status, _ = call(t, http.MethodGet, cars+"/bookings/T-1:car", "", nil)
		require.Equal(t, http.StatusNotFound, status)
		list, _ := items(t, cars+"/bookings")
		require.Empty(t, list)
	})

	t.Run("CommitLateThenUndo", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hotel := b.company("hotel")
		addFault(t, hotel, Rule{Op: OpHold, Fault: FaultCommitLate, DelayMS: 3000, Times: 1})

		_, _, err := send(t, client(100*time.Millisecond), http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Error(t, err)
		// The caller gave up and undoes; the company has not committed yet.
		status, body := call(t, http.MethodPost, hotel+"/holds/T-1:hotel/release", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.JSONEq(t, `{"status":"none"}`, body)

		testenv.Eventually(t, func() bool { return b.sims.LateCommits() == 1 }, "the late commit happened")
		_, got := call(t, http.MethodGet, hotel+"/holds/T-1:hotel", "", nil)
		require.Equal(t, "held", decode(t, got)["status"])
		// The next undo looks at the current record and releases it.
		status, body = call(t, http.MethodPost, hotel+"/holds/T-1:hotel/release", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "released", decode(t, body)["status"])
	})

	t.Run("CommitLateAfterRetryIsReplay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pay := b.company("payments")
		addFault(t, pay, Rule{Op: OpCharge, Fault: FaultCommitLate, DelayMS: 500, Times: 1})
		_, _, err := send(t, client(50*time.Millisecond), http.MethodPost, pay+"/charges", "T-1:charge", chargeBody("T-1", "tok_1", 100))
		require.Error(t, err)
		status, _ := call(t, http.MethodPost, pay+"/charges", "T-1:charge", chargeBody("T-1", "tok_1", 100))
		require.Equal(t, http.StatusCreated, status)
		testenv.Eventually(t, func() bool { return b.sims.LateCommits() == 1 }, "the late commit happened")
		list, _ := items(t, pay+"/charges")
		require.Len(t, list, 1)
		_, st := call(t, http.MethodGet, pay+"/statements/tok_1", "", nil)
		require.Len(t, decode(t, st)["lines"], 1)
	})

	t.Run("CommitLateAnswersNothingToPatientCaller", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		mail := b.company("mail")
		addFault(t, mail, Rule{Op: OpMessage, Fault: FaultCommitLate, DelayMS: 50, Times: 1})
		_, _, err := send(t, client(30*time.Second), http.MethodPost, mail+"/messages", "T-1:mail", messageBody("T-1"))
		require.Error(t, err)
		status, _ := call(t, http.MethodGet, mail+"/messages/T-1:mail", "", nil)
		require.Equal(t, http.StatusOK, status)
	})

	t.Run("SlowAnswer", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hotel := b.company("hotel")
		addFault(t, hotel, Rule{Op: OpHold, Fault: FaultSlowAnswer, DelayMS: 5000, Times: 1})
		_, _, err := send(t, client(100*time.Millisecond), http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Error(t, err)
		// Committed at once: visible by key, and a retry replays.
		testenv.Eventually(t, func() bool {
			status, _ := call(t, http.MethodGet, hotel+"/holds/T-1:hotel", "", nil)
			return status == http.StatusOK
		}, "slow answer never committed")
		status, _ := call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusCreated, status)

		// A patient caller gets the answer, no sooner than the delay.
		addFault(t, hotel, Rule{Op: OpHold, Fault: FaultSlowAnswer, DelayMS: 200, Times: 1})
		start := time.Now()
		status, body := call(t, http.MethodPost, hotel+"/holds", "T-2:hotel", holdBody("T-2"))
		require.Equal(t, http.StatusCreated, status, body)
		require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
		list, _ := items(t, hotel+"/holds")
		require.Len(t, list, 2)
	})

	t.Run("RuleControl", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hotel := b.company("hotel")
		for _, bad := range []string{
			`{"op":"charge","fault":"fail"}`,
			`{"op":"release","fault":"sold_out"}`,
			`{"op":"hold","fault":"declined"}`,
			`{"op":"hold","fault":"explode"}`,
			`{"op":"hold","fault":"hang","for_ms":10}`,
			`{"op":"hold","fault":"fail","times":-1}`,
			`{"op":"hold","fault":"fail","colour":"red"}`,
		} {
			status, body := call(t, http.MethodPost, hotel+"/_faults", "", bad)
			require.Equal(t, http.StatusUnprocessableEntity, status, bad)
			require.NotEmpty(t, decode(t, body)["error"], bad)
		}
		status, body := call(t, http.MethodPost, hotel+"/_faults", "", `{"op":"hold","fault":"fail","times":2}`)
		require.Equal(t, http.StatusCreated, status)
		rule := decode(t, body)
		require.True(t, strings.HasPrefix(rule["id"].(string), "F-"))
		require.Equal(t, "fail", rule["fault"])

		ctx := context.Background()
		require.NoError(t, AddFault(ctx, hotel, Rule{Op: OpRelease, Fault: FaultFail}))
		require.Error(t, AddFault(ctx, hotel, Rule{Op: OpBook, Fault: FaultFail}))
		rules, err := ListFaults(ctx, hotel)
		require.NoError(t, err)
		require.Len(t, rules, 2)
		// Faults are per company.
		rules, err = ListFaults(ctx, b.company("cars"))
		require.NoError(t, err)
		require.Empty(t, rules)

		require.NoError(t, ClearFaults(ctx, hotel))
		rules, err = ListFaults(ctx, hotel)
		require.NoError(t, err)
		require.Empty(t, rules)
		status, _ = call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusCreated, status)
	})
}

func TestMisbehavingAnswers(t *testing.T) {
	t.Parallel()

	t.Run("BadBodyCommitsAndAnswersJSONThatDoesNotParseAlsoByKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hotel := b.company("hotel")
		addFault(t, hotel, Rule{Op: OpHold, Fault: FaultBadBody})
		status, body := call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusCreated, status)
		require.False(t, json.Valid([]byte(body)), "not JSON: %s", body)
		status, body = call(t, http.MethodGet, hotel+"/holds/T-1:hotel", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.False(t, json.Valid([]byte(body)))
		list, _ := items(t, hotel+"/holds")
		require.Len(t, list, 1, "the hold was made; lists are never affected")

		require.NoError(t, ClearFaults(context.Background(), hotel))
		status, body = call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, "T-1:hotel", decode(t, body)["key"], "the stored first answer is replayed unharmed")
	})

	t.Run("WrongKeyNamesAnotherKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cars := b.company("cars")
		addFault(t, cars, Rule{Op: OpCancel, Fault: FaultWrongKey})
		status, _ := call(t, http.MethodPost, cars+"/bookings", "T-1:car", bookingBody("T-1", "a@example.com"))
		require.Equal(t, http.StatusCreated, status, "a rule of the undo op leaves the create alone")
		status, body := call(t, http.MethodPost, cars+"/bookings/T-1:car/cancel", "", nil)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "T-1:car:other", decode(t, body)["key"])
		require.Equal(t, "canceled", decode(t, body)["status"])
		_, body = call(t, http.MethodGet, cars+"/bookings/T-1:car", "", nil)
		require.Equal(t, "T-1:car:other", decode(t, body)["key"])
		_, body = call(t, http.MethodPost, cars+"/bookings/T-9:car/cancel", "", nil)
		require.JSONEq(t, `{"status":"none"}`, body, "an answer without a key is left alone")
	})

	t.Run("WrongAmountOnlyForCharges", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pay := b.company("payments")
		addFault(t, pay, Rule{Op: OpCharge, Fault: FaultWrongAmount, Match: map[string]string{"card_token": "tok_x"}})
		status, body := call(t, http.MethodPost, pay+"/charges", "T-1:charge", chargeBody("T-1", "tok_x", 250))
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, float64(25000), decode(t, body)["amount_cents"])
		_, body = call(t, http.MethodGet, pay+"/charges/T-1:charge", "", nil)
		require.Equal(t, float64(25000), decode(t, body)["amount_cents"])
		_, body = call(t, http.MethodGet, pay+"/statements/tok_x", "", nil)
		require.Contains(t, body, `"amount_cents":250`, "the card was charged the amount asked")
		status, _ = call(t, http.MethodPost, b.company("hotel")+"/_faults", "", `{"op":"hold","fault":"wrong_amount"}`)
		require.Equal(t, http.StatusUnprocessableEntity, status)
	})

	t.Run("UnknownStatusOnlyOn2xx", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hotel := b.company("hotel")
		addFault(t, hotel, Rule{Op: OpHold, Fault: FaultUnknownStatus})
		status, body := call(t, http.MethodPost, hotel+"/holds", "T-1:hotel", holdBody("T-1"))
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, UnknownStatusWord, decode(t, body)["status"])
		status, body = call(t, http.MethodGet, hotel+"/holds/T-2:hotel", "", nil)
		require.Equal(t, http.StatusNotFound, status)
		require.JSONEq(t, `{"status":"none"}`, body)
	})

	t.Run("UnauthorizedDoesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		mail := b.company("mail")
		addFault(t, mail, Rule{Op: OpMessage, Fault: FaultUnauthorized, Times: 2})
		status, body := call(t, http.MethodPost, mail+"/messages", "T-1:mail:confirmed", messageBody("T-1"))
		require.Equal(t, http.StatusUnauthorized, status)
		require.JSONEq(t, `{"error":"credentials expired"}`, body)
		status, _ = call(t, http.MethodGet, mail+"/messages/T-1:mail:confirmed", "", nil)
		require.Equal(t, http.StatusUnauthorized, status, "asking by key is refused too")
		status, _ = call(t, http.MethodGet, mail+"/messages/T-1:mail:confirmed", "", nil)
		require.Equal(t, http.StatusNotFound, status, "nothing happened; Times counts the GET")
		status, _ = call(t, http.MethodPost, mail+"/messages", "T-1:mail:confirmed", messageBody("T-1"))
		require.Equal(t, http.StatusAccepted, status)
	})
}
