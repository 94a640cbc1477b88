package provider

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// answering returns a company that answers every request with code and
// body.
func answering(t *testing.T, code int, body string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

var charge = map[string]any{"trip_id": "T-1", "amount_cents": 33000, "currency": "USD", "card_token": "tok_ok"}

func TestCreateNeverTakesAMisbehavingAnswerForSuccess(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		code        int
		body        string
		mismatch    string // the field a *MismatchError names
		credentials bool
	}{
		{"BodyThatDoesNotParse", 201, `{"key":"T-1:charge","charge_id":`, "", false},
		{"TwoObjects", 201, `{"key":"T-1:charge"}{}`, "", false},
		{"NoBody", 201, ``, "", false},
		{"LacksTheKey", 201, `{"charge_id":"C-1","status":"charged","amount_cents":33000,"currency":"USD"}`, "", false},
		{"LacksTheID", 201, `{"key":"T-1:charge","status":"charged","amount_cents":33000,"currency":"USD"}`, "", false},
		{"LacksTheAmount", 201, `{"key":"T-1:charge","charge_id":"C-1","status":"charged","currency":"USD"}`, "", false},
		{"UnknownStatusWord", 200, `{"key":"T-1:charge","charge_id":"C-1","status":"pending_review","amount_cents":33000,"currency":"USD"}`, "", false},
		{"NoStatusWord", 201, `{"key":"T-1:charge","charge_id":"C-1","amount_cents":33000,"currency":"USD"}`, "", false},
		{"AnotherKey", 201, `{"key":"T-2:charge","charge_id":"C-1","status":"charged","amount_cents":33000,"currency":"USD"}`, "key", false},
		{"AnotherAmount", 201, `{"key":"T-1:charge","charge_id":"C-1","status":"charged","amount_cents":3300000,"currency":"USD"}`, "amount_cents", false},
		{"AnotherCurrency", 201, `{"key":"T-1:charge","charge_id":"C-1","status":"charged","amount_cents":33000,"currency":"EUR"}`, "currency", false},
		{"Unauthorized", 401, `{"error":"credentials expired"}`, "", true},
		{"Forbidden", 403, ``, "", true},
		{"UnknownCode", 404, `{"error":"no such route"}`, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := Payments(answering(t, tc.code, tc.body)).Create(context.Background(), "T-1:charge", charge)
			require.ErrorIs(t, err, ErrUnknownOutcome, "ask again by key")
			require.Empty(t, res.Outcome, "never done, never rejected")
			var mismatch *MismatchError
			require.Equal(t, tc.mismatch != "", errors.As(err, &mismatch))
			if tc.mismatch != "" {
				require.Equal(t, tc.mismatch, mismatch.Field)
				require.Equal(t, "create", mismatch.Op)
			}
			var creds *CredentialsError
			require.Equal(t, tc.credentials, errors.As(err, &creds))
			if tc.credentials {
				require.Equal(t, tc.code, creds.Code)
			}
		})
	}

	t.Run("AGoodAnswerIsDone", func(t *testing.T) {
		t.Parallel()
		res, err := Payments(answering(t, 201, `{"key":"T-1:charge","charge_id":"C-1","status":"charged","amount_cents":33000,"currency":"USD"}`)).
			Create(context.Background(), "T-1:charge", charge)
		require.NoError(t, err)
		require.Equal(t, Done, res.Outcome)
		require.Equal(t, "C-1", res.Ref)
	})

	t.Run("BusinessRejectionsStillDecide", func(t *testing.T) {
		t.Parallel()
		res, err := Hotel(answering(t, 409, `{"status":"sold_out"}`)).Create(context.Background(), "T-1:hotel", map[string]any{"trip_id": "T-1"})
		require.NoError(t, err)
		require.Equal(t, Rejected, res.Outcome)
	})
}

func TestStatusNeverTakesAMisbehavingAnswerForAnOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		code        int
		body        string
		mismatch    string
		credentials bool
	}{
		{"BodyThatDoesNotParse", 200, `{"key":`, "", false},
		{"LacksTheKey", 200, `{"hold_id":"H-1","status":"held"}`, "", false},
		{"UnknownStatusWord", 200, `{"key":"T-1:hotel","hold_id":"H-1","status":"pending_review"}`, "", false},
		{"AnotherKey", 200, `{"key":"T-1:hotel:other","hold_id":"H-1","status":"held"}`, "key", false},
		{"NotFoundWithoutNone", 404, `{"error":"no such route"}`, "", false},
		{"Unauthorized", 401, `{"error":"credentials expired"}`, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := Hotel(answering(t, tc.code, tc.body)).Status(context.Background(), "T-1:hotel")
			require.ErrorIs(t, err, ErrUnknownOutcome)
			require.Empty(t, res.Outcome)
			var mismatch *MismatchError
			require.Equal(t, tc.mismatch != "", errors.As(err, &mismatch))
			var creds *CredentialsError
			require.Equal(t, tc.credentials, errors.As(err, &creds))
		})
	}

	t.Run("StatusForChecksTheAmountOfTheRequest", func(t *testing.T) {
		t.Parallel()
		c := Payments(answering(t, 200, `{"key":"T-1:charge","charge_id":"C-1","trip_id":"T-1","status":"charged","amount_cents":3300000,"currency":"USD"}`))
		res, err := c.Status(context.Background(), "T-1:charge")
		require.NoError(t, err, "without the request there is nothing to compare")
		require.Equal(t, "charged", res.Status)
		_, err = c.StatusFor(context.Background(), "T-1:charge", charge)
		var mismatch *MismatchError
		require.ErrorAs(t, err, &mismatch)
		require.Equal(t, "amount_cents", mismatch.Field)
		require.Equal(t, "33000", mismatch.Want)
		require.Equal(t, "3300000", mismatch.Got)
		require.ErrorIs(t, err, ErrUnknownOutcome)
	})

	t.Run("NoneIsNone", func(t *testing.T) {
		t.Parallel()
		res, err := Hotel(answering(t, 404, `{"status":"none"}`)).Status(context.Background(), "T-1:hotel")
		require.NoError(t, err)
		require.Equal(t, None, res.Outcome)
	})
}

func TestUndoNeverTakesAMisbehavingAnswerForUndone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		body     string
		mismatch bool
	}{
		{"BodyThatDoesNotParse", `{"key":"T-1:hotel","status":"rele`, false},
		{"NoBody", ``, false},
		{"EmptyObject", `{}`, false},
		{"UnknownStatusWord", `{"key":"T-1:hotel","status":"pending_review"}`, false},
		{"StillHeld", `{"key":"T-1:hotel","status":"held"}`, false},
		{"LacksTheKey", `{"status":"released"}`, false},
		{"AnotherKey", `{"key":"T-2:hotel","status":"released"}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := Hotel(answering(t, 200, tc.body)).Undo(context.Background(), "T-1:hotel")
			require.ErrorIs(t, err, ErrUnknownOutcome)
			require.Empty(t, res.Outcome)
			var mismatch *MismatchError
			require.Equal(t, tc.mismatch, errors.As(err, &mismatch))
		})
	}

	t.Run("ReleasedAndNoneDecide", func(t *testing.T) {
		t.Parallel()
		res, err := Hotel(answering(t, 200, `{"key":"T-1:hotel","status":"released"}`)).Undo(context.Background(), "T-1:hotel")
		require.NoError(t, err)
		require.Equal(t, Undone, res.Outcome)
		res, err = Hotel(answering(t, 200, `{"status":"none"}`)).Undo(context.Background(), "T-1:hotel")
		require.NoError(t, err)
		require.Equal(t, None, res.Outcome)
	})
}
