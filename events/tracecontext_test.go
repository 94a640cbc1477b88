package events

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The distributed-tracing extension travels as ce-traceparent and
// ce-tracestate (percent-encoded like every header) and comes back as the
// extension attributes; an event without it decodes without it.
func TestTraceContextRoundTrip(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const ts = "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"
	e, err := New(Source("hotel"), HotelHeld, "T-1", StepData{TripID: "T-1", Step: "hotel"})
	require.NoError(t, err)
	plain := e.Clone()
	e.SetExtension("traceparent", tp)
	e.SetExtension("tracestate", ts)
	h, err := EncodeHeaders(e)
	require.NoError(t, err)
	require.Equal(t, tp, h[HeaderTraceparent])
	require.Equal(t, "rojo=00f067aa0ba902b7,%20congo=t61rcWkgMzE", h[HeaderTracestate])
	gotTP, gotTS := TraceContextOfHeaders(h)
	require.Equal(t, tp, gotTP)
	require.Equal(t, ts, gotTS)

	nh := map[string][]string{}
	for k, v := range h {
		nh[k] = []string{v}
	}
	got, err := Decode(nh, e.Data())
	require.NoError(t, err)
	require.Equal(t, tp, got.Extensions()["traceparent"])
	require.Equal(t, ts, got.Extensions()["tracestate"])

	h, err = EncodeHeaders(plain)
	require.NoError(t, err)
	require.NotContains(t, h, HeaderTraceparent)
	gotTP, gotTS = TraceContextOfHeaders(h)
	require.Empty(t, gotTP)
	require.Empty(t, gotTS)
	nh = map[string][]string{}
	for k, v := range h {
		nh[k] = []string{v}
	}
	got, err = Decode(nh, plain.Data())
	require.NoError(t, err)
	require.Empty(t, got.Extensions())
}
