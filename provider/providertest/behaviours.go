package providertest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every behaviour makes its own trip id and keys, so all run in parallel.

// testCreate: a create under a new key answers 201 (202 for mail) with the
// key, the company's id and the created status.
func (s *suite) testCreate(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	key := s.key(trip)
	a := s.mustCreate(t, key, s.c.body(trip, 0))
	require.Contains(t, a.header.Get("Content-Type"), "application/json", "Content-Type")
	require.Equal(t, key, a.body["key"], "key: %s", a.raw)
	require.IsType(t, "", a.body[s.c.idField], "%s: %s", s.c.idField, a.raw)
	require.NotEmpty(t, a.body[s.c.idField], "%s: %s", s.c.idField, a.raw)
	require.Equal(t, s.c.created, a.body["status"], "status: %s", a.raw)
}

// testReplay: the same key with the same body is answered with the first
// answer again, and nothing new happens.
func (s *suite) testReplay(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	key := s.key(trip)
	body := s.c.body(trip, 0)
	first := s.mustCreate(t, key, body)
	for range 2 {
		again := s.create(t, key, body)
		require.Equal(t, first.code, again.code, "replay: %s", again.raw)
		require.Equal(t, first.body, again.body, "replay must repeat the first answer")
	}
	recs := s.recordsOfTrip(t, trip)
	require.Len(t, recs, 1, "one record for the trip after replays: %v", recs)
	require.Equal(t, key, recs[0]["key"])
	require.Equal(t, first.body[s.c.idField], recs[0][s.c.idField])
	if s.c.cardToken != nil {
		lines := s.statementOfTrip(t, s.c.cardToken(trip), trip)
		require.Len(t, lines, 1, "one statement line after replays: %v", lines)
		require.Equal(t, "charge", lines[0]["kind"])
	}
}

// testKeyReused: the same key with a different body is refused with 422
// idempotency_key_reused, and nothing happens.
func (s *suite) testKeyReused(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	key := s.key(trip)
	first := s.mustCreate(t, key, s.c.body(trip, 0))

	a := s.create(t, key, s.c.body(trip, 1))
	require.Equal(t, http.StatusUnprocessableEntity, a.code, "different body under a used key: %s", a.raw)
	require.Equal(t, "idempotency_key_reused", a.body["error"], "error: %s", a.raw)

	// The first operation stands, unchanged, and is still replayed.
	again := s.create(t, key, s.c.body(trip, 0))
	require.Equal(t, first.code, again.code, "replay after a refused reuse: %s", again.raw)
	require.Equal(t, first.body, again.body)
	g := s.get(t, key)
	require.Equal(t, http.StatusOK, g.code, "get: %s", g.raw)
	require.Equal(t, first.body[s.c.idField], g.body[s.c.idField])
	recs := s.recordsOfTrip(t, trip)
	require.Len(t, recs, 1, "one record for the trip: %v", recs)
	if s.c.cardToken != nil {
		lines := s.statementOfTrip(t, s.c.cardToken(trip), trip)
		require.Len(t, lines, 1, "one statement line: %v", lines)
		requireInteger(t, 12345, lines[0]["amount_cents"], "the first charge's amount")
	}
}

// testMissingKey: a create without Idempotency-Key is refused with 422, and
// nothing happens.
func (s *suite) testMissingKey(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	a := s.create(t, "", s.c.body(trip, 0))
	require.Equal(t, http.StatusUnprocessableEntity, a.code, "create without Idempotency-Key: %s", a.raw)
	require.Empty(t, s.recordsOfTrip(t, trip), "no record for a refused create")
	if s.c.cardToken != nil {
		require.Empty(t, s.statementOfTrip(t, s.c.cardToken(trip), trip), "no statement line for a refused charge")
	}
}

// testGet: GET /<resource>/{key} answers 200 with the resource.
func (s *suite) testGet(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	key := s.key(trip)
	created := s.mustCreate(t, key, s.c.body(trip, 0))
	g := s.get(t, key)
	require.Equal(t, http.StatusOK, g.code, "get: %s", g.raw)
	require.Equal(t, key, g.body["key"], "key: %s", g.raw)
	require.Equal(t, created.body[s.c.idField], g.body[s.c.idField], "%s: %s", s.c.idField, g.raw)
	if s.c.undoVerb != "" {
		// The contract lists trip_id and status for holds, charges and
		// bookings; a message's resource is left open ("{...}").
		require.Equal(t, trip, g.body["trip_id"], "trip_id: %s", g.raw)
		require.Equal(t, s.c.created, g.body["status"], "status: %s", g.raw)
	}
}

// testGetUnknown: GET of a key the company never saw answers 404
// {"status":"none"}.
func (s *suite) testGetUnknown(t *testing.T) {
	t.Parallel()
	g := s.get(t, s.key(newTrip(), "never"))
	require.Equal(t, http.StatusNotFound, g.code, "get unknown key: %s", g.raw)
	require.Equal(t, "none", g.body["status"], "status: %s", g.raw)
}

// testUndo: release/refund/cancel by key answers 200 with the undone
// status; repeating it answers the same; GET then shows the undone status.
func (s *suite) testUndo(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	key := s.key(trip)
	created := s.mustCreate(t, key, s.c.body(trip, 0))

	u := s.undo(t, key)
	require.Equal(t, http.StatusOK, u.code, "%s: %s", s.c.undoVerb, u.raw)
	require.Equal(t, key, u.body["key"], "key: %s", u.raw)
	require.Equal(t, s.c.undone, u.body["status"], "status: %s", u.raw)
	if s.c.cardToken != nil {
		require.IsType(t, "", u.body["refund_id"], "refund_id: %s", u.raw)
		require.NotEmpty(t, u.body["refund_id"], "refund_id: %s", u.raw)
	}

	again := s.undo(t, key)
	require.Equal(t, http.StatusOK, again.code, "repeated %s: %s", s.c.undoVerb, again.raw)
	require.Equal(t, u.body, again.body, "a repeated undo answers the same")

	g := s.get(t, key)
	require.Equal(t, http.StatusOK, g.code, "get: %s", g.raw)
	require.Equal(t, s.c.undone, g.body["status"], "status after %s: %s", s.c.undoVerb, g.raw)
	require.Equal(t, created.body[s.c.idField], g.body[s.c.idField])
	require.Equal(t, trip, g.body["trip_id"])
}

// testUndoUnknown: an undo of a key the company never saw answers 200
// {"status":"none"}, again when repeated, and changes nothing.
func (s *suite) testUndoUnknown(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	key := s.key(trip)
	for range 2 {
		u := s.undo(t, key)
		require.Equal(t, http.StatusOK, u.code, "%s of an unknown key: %s", s.c.undoVerb, u.raw)
		require.Equal(t, "none", u.body["status"], "status: %s", u.raw)
	}
	g := s.get(t, key)
	require.Equal(t, http.StatusNotFound, g.code, "get after undoing an unknown key: %s", g.raw)
	require.Equal(t, "none", g.body["status"])

	// The key is still free: a create under it afterwards is a first create.
	a := s.mustCreate(t, key, s.c.body(trip, 0))
	require.Equal(t, s.c.created, a.body["status"], "create after an undo of the unknown key: %s", a.raw)
}

// testListPaging: the list is oldest first, next is given only when another
// page follows, and walking the pages by next returns each record once.
// The list is shared with every other test, so the suite checks the order of
// its own records and starts its small-page walk at the page where they
// begin.
func (s *suite) testListPaging(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	const n = 5
	keys := make([]string, n)
	for i := range keys {
		keys[i] = s.key(trip, strconv.Itoa(i+1))
		s.mustCreate(t, keys[i], s.c.body(trip, 0))
	}

	all, _ := s.walk(t, "", 1000, "")
	requireEachOnce(t, all)
	require.Equal(t, keys, keysOf(ofTrip(all, trip)), "records oldest first, each once (limit 1000)")
	start, found := "", false
	for _, it := range all {
		if it.item["key"] == keys[0] {
			start, found = it.after, true
			break
		}
	}
	require.True(t, found)

	const limit = 2
	items, pages := s.walk(t, "", limit, start)
	requireEachOnce(t, items)
	require.Equal(t, keys, keysOf(ofTrip(items, trip)), "records oldest first, each once (limit %d)", limit)
	require.GreaterOrEqual(t, len(pages), (n+limit-1)/limit, "pages of %d", limit)
	for i, p := range pages {
		if p.hasNext {
			// Records are only ever added, so a page announced by next
			// cannot have emptied since.
			require.Positive(t, pages[i+1].n, "page %d gave next, but the page it points to is empty", i)
		}
	}
	require.False(t, pages[len(pages)-1].hasNext, "the last page has no next")
}

// testListStatus: ?status= lists only records in that status.
func (s *suite) testListStatus(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	keys := make([]string, 3)
	for i := range keys {
		keys[i] = s.key(trip, strconv.Itoa(i+1))
		s.mustCreate(t, keys[i], s.c.body(trip, 0))
	}
	u := s.undo(t, keys[1])
	require.Equal(t, http.StatusOK, u.code, "%s: %s", s.c.undoVerb, u.raw)

	for _, tc := range []struct {
		status string
		want   []string
	}{
		{s.c.created, []string{keys[0], keys[2]}},
		{s.c.undone, []string{keys[1]}},
	} {
		items, _ := s.walk(t, tc.status, 1000, "")
		requireEachOnce(t, items)
		for _, it := range items {
			require.Equal(t, tc.status, it.item["status"], "?status=%s listed %v", tc.status, it.item["key"])
		}
		require.Equal(t, tc.want, keysOf(ofTrip(items, trip)), "?status=%s", tc.status)
	}
}

// testListLimit: limit=1000 is served; a page never holds more than 1000.
func (s *suite) testListLimit(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	s.mustCreate(t, s.key(trip), s.c.body(trip, 0))
	a := s.do(t, http.MethodGet, s.collectionPath()+"?limit=1000", "", nil)
	require.Equal(t, http.StatusOK, a.code, "limit=1000: %s", a.raw)
	items, ok := a.body["items"].([]any)
	require.True(t, ok, "items: %s", a.raw)
	require.NotEmpty(t, items)
	require.LessOrEqual(t, len(items), 1000)

	// Above the maximum: refused, or served with at most 1000.
	a = s.do(t, http.MethodGet, s.collectionPath()+"?limit=1001", "", nil)
	switch a.code {
	case http.StatusUnprocessableEntity:
	case http.StatusOK:
		items, ok := a.body["items"].([]any)
		require.True(t, ok, "items: %s", a.raw)
		require.LessOrEqual(t, len(items), 1000, "limit=1001 served more than 1000")
	default:
		require.Failf(t, "limit=1001", "want 422 or 200 with at most 1000 items, got %d: %s", a.code, a.raw)
	}
}

// testSoldOut (hotel, car, insurer; Features.Faults): a sold-out answer
// is 409 {"status":"sold_out"} (the insurer's rejection 409
// {"status":"rejected","reason"}), replayed by key; nothing is held,
// booked or insured, and undoing the key is a no-op.
func (s *suite) testSoldOut(t *testing.T) {
	if !s.f.Faults {
		t.Skip("needs Features.Faults")
	}
	t.Parallel()
	trip := newTrip()
	key := s.key(trip)
	s.addRule(t, map[string]any{
		"op": s.c.faultOp, "fault": s.c.businessFault, "match": map[string]string{"trip_id": trip}, "times": 1,
	})
	body := s.c.body(trip, 0)
	first := s.create(t, key, body)
	require.Equal(t, s.c.refusedCode, first.code, "%s: %s", s.c.businessFault, first.raw)
	require.Equal(t, s.c.businessFault, first.body["status"], "status: %s", first.raw)
	for range 2 {
		again := s.create(t, key, body)
		require.Equal(t, first.code, again.code, "replay of sold out: %s", again.raw)
		require.Equal(t, first.body, again.body, "replay of sold out")
	}
	active, _ := s.walk(t, s.c.created, 1000, "")
	require.Empty(t, ofTrip(active, trip), "nothing %s after sold out", s.c.created)
	u := s.undo(t, key)
	require.Equal(t, http.StatusOK, u.code, "%s after sold out: %s", s.c.undoVerb, u.raw)
	require.Equal(t, "none", u.body["status"], "%s of a step that never happened: %s", s.c.undoVerb, u.raw)
}

// testDeclineRule (card; Features.Faults): a decline is 402
// {"status":"declined","reason"}, replayed by key, and refunding it answers
// {"status":"none"}.
func (s *suite) testDeclineRule(t *testing.T) {
	if !s.f.Faults {
		t.Skip("needs Features.Faults")
	}
	t.Parallel()
	trip := newTrip()
	s.addRule(t, map[string]any{
		"op": "charge", "fault": "declined", "match": map[string]string{"trip_id": trip}, "times": 1,
	})
	s.checkDeclined(t, trip, s.c.body(trip, 0))
}

// testDeclinedCardToken (card; Features.DeclinedCardToken): as
// testDeclineRule, with the card the company always declines.
func (s *suite) testDeclinedCardToken(t *testing.T) {
	if s.f.DeclinedCardToken == "" {
		t.Skip("needs Features.DeclinedCardToken")
	}
	t.Parallel()
	trip := newTrip()
	body := s.c.body(trip, 0)
	body["card_token"] = s.f.DeclinedCardToken
	s.checkDeclined(t, trip, body)
}

func (s *suite) checkDeclined(t *testing.T, trip string, body map[string]any) {
	t.Helper()
	key := s.key(trip)
	first := s.create(t, key, body)
	require.Equal(t, http.StatusPaymentRequired, first.code, "declined: %s", first.raw)
	require.Equal(t, "declined", first.body["status"], "status: %s", first.raw)
	require.IsType(t, "", first.body["reason"], "reason: %s", first.raw)
	require.NotEmpty(t, first.body["reason"], "reason: %s", first.raw)
	for range 2 {
		again := s.create(t, key, body)
		require.Equal(t, first.code, again.code, "replay of a decline: %s", again.raw)
		require.Equal(t, first.body, again.body, "replay of a decline")
	}

	g := s.get(t, key)
	require.Equal(t, http.StatusOK, g.code, "get a declined charge: %s", g.raw)
	require.Equal(t, "declined", g.body["status"], "status: %s", g.raw)
	require.Equal(t, trip, g.body["trip_id"])

	for range 2 {
		u := s.undo(t, key)
		require.Equal(t, http.StatusOK, u.code, "refund of a declined charge: %s", u.raw)
		require.Equal(t, "none", u.body["status"], "refund of a declined charge: %s", u.raw)
	}
	g = s.get(t, key)
	require.Equal(t, "declined", g.body["status"], "status after refunding a decline: %s", g.raw)

	require.Empty(t, s.statementOfTrip(t, body["card_token"].(string), trip), "no statement line for a decline")
	declined, _ := s.walk(t, "declined", 1000, "")
	require.Equal(t, []string{key}, keysOf(ofTrip(declined, trip)), "?status=declined")
}

// testMoney (card): amount_cents is an integer and the currency is echoed,
// in the answer, by GET and on the statement.
func (s *suite) testMoney(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cents    int64
		currency string
	}{
		{12345, "EUR"},
		{7, "JPY"},
		{100000000, "USD"},
	} {
		trip := newTrip()
		key := s.key(trip)
		body := s.c.body(trip, 0)
		body["amount_cents"] = tc.cents
		body["currency"] = tc.currency

		a := s.mustCreate(t, key, body)
		requireInteger(t, tc.cents, a.body["amount_cents"], "amount_cents: %s", a.raw)
		require.Equal(t, tc.currency, a.body["currency"], "currency: %s", a.raw)

		g := s.get(t, key)
		require.Equal(t, http.StatusOK, g.code, "get: %s", g.raw)
		requireInteger(t, tc.cents, g.body["amount_cents"], "amount_cents by GET: %s", g.raw)
		require.Equal(t, tc.currency, g.body["currency"], "currency by GET: %s", g.raw)

		lines := s.statementOfTrip(t, s.c.cardToken(trip), trip)
		require.Len(t, lines, 1, "statement: %v", lines)
		requireInteger(t, tc.cents, lines[0]["amount_cents"], "statement amount_cents: %v", lines[0])
	}
}

// testRefundStatement (card): a refund never deletes the charge: the
// statement keeps the charge line and gains one refund line, once however
// often the refund is repeated.
func (s *suite) testRefundStatement(t *testing.T) {
	t.Parallel()
	trip := newTrip()
	key := s.key(trip)
	token := s.c.cardToken(trip)
	s.mustCreate(t, key, s.c.body(trip, 0))
	lines := s.statementOfTrip(t, token, trip)
	require.Len(t, lines, 1, "statement after the charge: %v", lines)
	require.Equal(t, "charge", lines[0]["kind"])

	for range 2 {
		u := s.undo(t, key)
		require.Equal(t, http.StatusOK, u.code, "refund: %s", u.raw)
		require.Equal(t, "refunded", u.body["status"])
	}

	lines = s.statementOfTrip(t, token, trip)
	require.Len(t, lines, 2, "statement after the refund: %v", lines)
	kinds := map[string]int{}
	for _, l := range lines {
		kind, _ := l["kind"].(string)
		kinds[kind]++
		require.NotEmpty(t, l["at"], "line without at: %v", l)
		n, ok := l["amount_cents"].(json.Number)
		require.True(t, ok, "amount_cents must be a JSON number: %v", l)
		// The contract does not fix the sign of a refund line.
		amount, err := strconv.ParseInt(n.String(), 10, 64)
		require.NoError(t, err, "amount_cents must be an integer: %v", l)
		require.Contains(t, []int64{12345, -12345}, amount, "line amount: %v", l)
	}
	require.Equal(t, map[string]int{"charge": 1, "refund": 1}, kinds, "statement lines: %v", lines)
}

// testMailByTrip (mail): GET /messages?trip_id=T lists the trip's messages
// and no other trip's.
func (s *suite) testMailByTrip(t *testing.T) {
	t.Parallel()
	trip, other := newTrip(), newTrip()
	k1, k2, k3 := s.key(trip), s.key(trip, "2"), s.key(other)
	s.mustCreate(t, k1, s.c.body(trip, 0))
	s.mustCreate(t, k2, s.c.body(trip, 1))
	s.mustCreate(t, k3, s.c.body(other, 0))

	recs := s.recordsOfTrip(t, trip)
	require.ElementsMatch(t, []string{k1, k2}, keysOf(recs), "messages of %s: %v", trip, recs)
	for _, r := range recs {
		require.Equal(t, trip, r["trip_id"], "message of another trip listed: %v", r)
	}
	require.Equal(t, []string{k3}, keysOf(s.recordsOfTrip(t, other)))
}

// requireEachOnce requires no key to appear twice in a walk.
func requireEachOnce(t *testing.T, items []listed) {
	t.Helper()
	seen := make(map[string]bool, len(items))
	for _, it := range items {
		k, _ := it.item["key"].(string)
		require.False(t, seen[k], "key %s listed twice in one walk", k)
		seen[k] = true
	}
}
