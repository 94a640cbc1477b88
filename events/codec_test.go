package events

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCodecRoundTripNonASCII(t *testing.T) {
	e, err := New("/tripsaga/hôtel-zürich", HotelHeld, "T-1", StepData{TripID: "T-1", Step: "hotel", Reason: "ü"})
	require.NoError(t, err)
	e.SetSubject("Trip für Ünïcode ✈ 50% \"x\"")
	e.SetExtension("traceparent", "00-abc-def-01")
	h, err := EncodeHeaders(e)
	require.NoError(t, err)
	for k, v := range h {
		for i := 0; i < len(v); i++ {
			require.Truef(t, v[i] > ' ' && v[i] <= '~' && v[i] != '"', "header %s has raw byte %q", k, v[i])
		}
	}
	require.Equal(t, "Trip%20f%C3%BCr%20%C3%9Cn%C3%AFcode%20%E2%9C%88%2050%25%20%22x%22", h["ce-subject"])
	require.NotContains(t, h, "Content-Type", "binary mode carries datacontenttype as ce-datacontenttype")
	require.Equal(t, "application/json", h["ce-datacontenttype"])

	nh := map[string][]string{}
	for k, v := range h {
		nh[k] = []string{v}
	}
	got, err := Decode(nh, e.Data())
	require.NoError(t, err)
	require.Equal(t, e.ID(), got.ID())
	require.Equal(t, e.Source(), got.Source())
	require.Equal(t, e.Subject(), got.Subject())
	require.Equal(t, e.Type(), got.Type())
	require.True(t, e.Time().Equal(got.Time()))
	require.Equal(t, "00-abc-def-01", got.Extensions()["traceparent"])
	var d StepData
	require.NoError(t, DecodeData(got, &d))
	require.Equal(t, "ü", d.Reason)
}

func TestDecodeStructuredMode(t *testing.T) {
	body := []byte(`{"specversion":"1.0","id":"1","source":"/x","type":"io.tripsaga.car.booked.v1","subject":"T-9","datacontenttype":"application/json","data":{"trip_id":"T-9"}}`)
	e, err := Decode(map[string][]string{"Content-Type": {"application/cloudevents+json"}}, body)
	require.NoError(t, err)
	require.Equal(t, "T-9", e.Subject())
	var d StepData
	require.NoError(t, DecodeData(e, &d))
	require.Equal(t, "T-9", d.TripID)
}

func TestDecodeRejects(t *testing.T) {
	cases := map[string]map[string][]string{
		"NoSpecVersion": {"ce-id": {"1"}, "ce-source": {"/x"}, "ce-type": {"t"}},
		"NoID":          {"ce-specversion": {"1.0"}, "ce-source": {"/x"}, "ce-type": {"t"}},
		"BadEscape":     {"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-source": {"/x%zz"}, "ce-type": {"t"}},
		"BadTime":       {"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-source": {"/x"}, "ce-type": {"t"}, "ce-time": {"yesterday"}},
		// Found by FuzzDecode: an unknown version left a nil context and panicked.
		// Found by FuzzDecode: a raw byte that is not UTF-8 decoded, and did not decode again once encoded.
		"RawNotUTF8":         {"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-source": {"/x"}, "ce-type": {"\x82"}},
		"UnknownSpecVersion": {"ce-specversion": {"0"}, "ce-id": {"1"}, "ce-source": {"/x"}, "ce-type": {"t"}, "ce-x": {"y"}},
		// Found by FuzzDecode in CI: an extension named data became the data
		// once encoded in structured mode.
		"ExtensionNamedData":       {"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-source": {"/x"}, "ce-type": {"t"}, "ce-data": {"00"}},
		"ExtensionNamedDataBase64": {"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-source": {"/x"}, "ce-type": {"t"}, "ce-data_base64": {"AA=="}},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(h, nil)
			require.ErrorIs(t, err, ErrInvalidEvent)
		})
	}
}

func TestSubject(t *testing.T) {
	s, err := Subject(HotelHeld, "T-01ABC")
	require.NoError(t, err)
	require.Equal(t, "hotel.held.T-01ABC", s)
	_, err = Subject(HotelHeld, "T.1")
	require.ErrorIs(t, err, ErrInvalidEvent)
	_, err = Subject("hotel.held", "T-1")
	require.ErrorIs(t, err, ErrUnknownType)
}
