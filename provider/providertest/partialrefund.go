package providertest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// refundWith posts a refund of key with body (providers.md, "Partial
// refunds").
func (s *suite) refundWith(t *testing.T, key string, body map[string]any) answer {
	t.Helper()
	return s.do(t, http.MethodPost, s.keyPath(key)+"/"+s.c.undoVerb, "", body)
}

// testPartialRefund (card): a refund with {"amount_cents": N} refunds N
// of the charge: the answer and GET /charges/{key} say refunded with
// refunded_cents N, the statement gains one refund line of N, and a
// refund repeated (with any amount, or none) answers the first refund
// again and adds no line.
func (s *suite) testPartialRefund(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	key := s.key(trip)
	token := s.c.cardToken(trip)
	s.mustCreate(t, key, s.c.body(trip, 0)) // 12345 charged
	for _, body := range []map[string]any{{"amount_cents": 4321}, {"amount_cents": 4321}, {"amount_cents": 100}, nil} {
		var u answer
		if body != nil {
			u = s.refundWith(t, key, body)
		} else {
			u = s.undo(t, key) // no body
		}
		require.Equal(t, http.StatusOK, u.code, "refund %v: %s", body, u.raw)
		require.Equal(t, "refunded", u.body["status"], "refund %v: %s", body, u.raw)
		require.Equal(t, json.Number("4321"), u.body["refunded_cents"], "refund %v answers the first refund: %s", body, u.raw)
	}
	g := s.get(t, key)
	require.Equal(t, "refunded", g.body["status"], "GET: %s", g.raw)
	require.Equal(t, json.Number("4321"), g.body["refunded_cents"], "GET: %s", g.raw)
	require.Equal(t, json.Number("12345"), g.body["amount_cents"], "the charge keeps its amount: %s", g.raw)

	lines := s.statementOfTrip(t, token, trip)
	amounts := map[string]int64{}
	for _, l := range lines {
		kind, _ := l["kind"].(string)
		n, _ := l["amount_cents"].(json.Number)
		v, err := strconv.ParseInt(n.String(), 10, 64)
		require.NoError(t, err, "amount_cents must be an integer: %v", l)
		if v < 0 { // the contract does not fix the sign of a refund line
			v = -v
		}
		amounts[kind] += v
	}
	require.Len(t, lines, 2, "one charge and one refund line: %v", lines)
	require.Equal(t, map[string]int64{"charge": 12345, "refund": 4321}, amounts, "statement: %v", lines)
}

// testPartialRefundRefused (card): a refund of more than was charged, or a
// body whose amount_cents is not an integer of at least 1, is refused
// with 422 and nothing happens: the charge is still charged, and a full
// refund without a body still works after it.
func (s *suite) testPartialRefundRefused(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	key := s.key(trip)
	s.mustCreate(t, key, s.c.body(trip, 0))
	for _, body := range []map[string]any{{"amount_cents": 12346}, {"amount_cents": 0}, {"amount_cents": -5}, {"amount_cents": "12"}, {"amount_cents": 1.5}} {
		u := s.refundWith(t, key, body)
		require.Equal(t, http.StatusUnprocessableEntity, u.code, "refund %v: %s", body, u.raw)
	}
	g := s.get(t, key)
	require.Equal(t, "charged", g.body["status"], "nothing happened: %s", g.raw)
	u := s.undo(t, key)
	require.Equal(t, http.StatusOK, u.code, "full refund: %s", u.raw)
	require.Equal(t, json.Number("12345"), u.body["refunded_cents"], "a refund without a body refunds the whole charge: %s", u.raw)
}
