package provider

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUndoTellsARefusalFromAnUnknownOutcome(t *testing.T) {
	for _, tc := range []struct {
		code    int
		body    string
		refused bool
		reason  string
	}{
		{422, `{"error":"card closed"}`, true, "card closed"},
		{401, ``, true, "Unauthorized"},
		{403, `{"reason":"account frozen"}`, true, "account frozen"},
		{429, `{"error":"slow down"}`, false, ""},
		{408, ``, false, ""},
		{503, `{"error":"unavailable"}`, false, ""},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(tc.code)
			_, _ = w.Write([]byte(tc.body))
		}))
		_, err := Payments(srv.URL).Undo(context.Background(), "T-1:charge")
		srv.Close()
		var refused *RefusedError
		if tc.refused {
			require.ErrorAs(t, err, &refused, "%d", tc.code)
			require.Equal(t, tc.code, refused.Code)
			require.Equal(t, tc.reason, refused.Reason)
			require.Equal(t, "refund", refused.Op)
			require.NotErrorIs(t, err, ErrUnknownOutcome, "a refusal decides")
		} else {
			require.False(t, errors.As(err, &refused), "%d is not a refusal", tc.code)
			require.ErrorIs(t, err, ErrUnknownOutcome, "%d: ask again by key", tc.code)
		}
	}
}
