package saga_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/provider"
	"github.com/tripsaga/tripsaga/saga"
	"github.com/tripsaga/tripsaga/sim"
)

// TestUndoStep: the traveler's cancellation step calls the company's undo
// by the booking's key, a partial refund with its amount, once however
// often it is asked; its status says done only for the amount asked; a
// refund of nothing calls nobody; an undo of a key the company never saw
// is done too (nothing in force).
func TestUndoStep(t *testing.T) {
	ctx := context.Background()
	sims, err := sim.New(ctx, sim.Config{Memory: true})
	require.NoError(t, err)
	srv := httptest.NewServer(sims.Handler())
	t.Cleanup(func() { srv.Close(); sims.Close() })
	pay := provider.Payments(srv.URL + "/payments")
	u := saga.UndoStep{Client: pay}
	res, err := pay.Create(ctx, "T-u1:charge", map[string]any{"trip_id": "T-u1", "amount_cents": 33001, "currency": "USD", "card_token": "tok_u1"})
	require.NoError(t, err)
	require.Equal(t, provider.Done, res.Outcome)

	body := func(amount int64) json.RawMessage {
		b, err := json.Marshal(saga.UndoRequest{TripID: "T-u1", Key: "T-u1:charge", AmountCents: &amount})
		require.NoError(t, err)
		return b
	}
	for range 2 {
		res, err = u.Create(ctx, "T-u1:traveler_refund", body(24751))
		require.NoError(t, err)
		require.Equal(t, provider.Done, res.Outcome)
		require.Equal(t, int64(24751), res.RefundedCents)
	}
	st, err := u.StatusFor(ctx, "T-u1:traveler_refund", body(24751))
	require.NoError(t, err)
	require.Equal(t, []any{provider.Done, "refunded"}, []any{st.Outcome, st.Status})
	// Asked about another amount: never taken as done.
	_, err = u.StatusFor(ctx, "T-u1:traveler_refund", body(100))
	var mismatch *provider.MismatchError
	require.ErrorAs(t, err, &mismatch)
	// A second refund of another amount answers the first: a mismatch too.
	_, err = u.Create(ctx, "T-u1:traveler_refund", body(100))
	require.ErrorAs(t, err, &mismatch)

	// The fee is the whole charge: nothing to call.
	res, err = u.Create(ctx, "T-u2:traveler_refund", body(0))
	require.NoError(t, err)
	require.Equal(t, []any{provider.Done, "nothing_to_refund"}, []any{res.Outcome, res.Status})

	// Nothing under the key: done, nothing was in force.
	res, err = saga.UndoStep{Client: provider.Hotel(srv.URL + "/hotel")}.Create(ctx, "T-u3:traveler_release",
		json.RawMessage(`{"trip_id":"T-u3","key":"T-u3:hotel"}`))
	require.NoError(t, err)
	require.Equal(t, provider.Done, res.Outcome)

	// A body without the key is refused before any call.
	_, err = u.Create(ctx, "T-u4:traveler_refund", json.RawMessage(`{"trip_id":"T-u4"}`))
	require.ErrorContains(t, err, "without the key")
}
