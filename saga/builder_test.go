package saga_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/saga"
)

var errQuantity = errors.New("quantity: want 1 to 1000, with an order id and a postcode")

// TestBuilderDecodesAndChecksTheSagasOwnRequest: a step's Build made with
// saga.Builder gets the saga's request as the saga's own type (a shop
// order here, with an address the trip has no place for), checked by its
// own Validate; a request that does not decode, has a field the type does
// not know, or fails Validate is refused, naming why, and build is not
// called.
func TestBuilderDecodesAndChecksTheSagasOwnRequest(t *testing.T) {
	t.Parallel()
	var got []shopOrder
	build := saga.Builder(func(id string, o shopOrder) (any, error) {
		got = append(got, o)
		return map[string]any{"ref": id, "postcode": o.Address.Postcode, "qty": o.Quantity}, nil
	})

	body, err := build("O-1", json.RawMessage(`{"order_id":"O-1","quantity":3,"address":{"street":"1 Main St","postcode":"75001"}}`))
	require.NoError(t, err)
	require.Equal(t, map[string]any{"ref": "O-1", "postcode": "75001", "qty": 3}, body)
	require.Len(t, got, 1)
	require.Equal(t, "1 Main St", got[0].Address.Street)

	_, err = build("O-2", json.RawMessage(`{"order_id":"O-2","quantity":0,"address":{"postcode":"75001"}}`))
	require.ErrorIs(t, err, errQuantity, "the saga's own rule")
	_, err = build("O-3", json.RawMessage(`{"order_id":"O-3","quantity":2,"colour":"red"}`))
	require.ErrorContains(t, err, `unknown field "colour"`, "never half understood")
	_, err = build("O-4", json.RawMessage(`{"order_id":`))
	require.ErrorContains(t, err, "request:")
	require.Len(t, got, 1, "build is called only with a valid request")
}
