package httpx

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStatusRecorder(t *testing.T) {
	rec := &StatusRecorder{ResponseWriter: httptest.NewRecorder()}
	require.Zero(t, rec.Status, "nothing written yet")
	_, _ = rec.Write([]byte("x"))
	require.Equal(t, http.StatusOK, rec.Status, "a body without a status is a 200")

	rec = &StatusRecorder{ResponseWriter: httptest.NewRecorder()}
	rec.WriteHeader(http.StatusTeapot)
	rec.WriteHeader(http.StatusInternalServerError)
	require.Equal(t, http.StatusTeapot, rec.Status, "the first status counts")
	require.NotNil(t, http.NewResponseController(rec))
}
