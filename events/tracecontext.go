package events

// The CloudEvents distributed-tracing extension (CloudEvents spec,
// extensions/distributed-tracing.md): the W3C trace context of the span
// that produced an event, in the extension attributes traceparent and
// tracestate. In binary mode they travel as the headers ce-traceparent and
// ce-tracestate, like any extension ([EncodeHeaders], [Decode]); an event
// without them is as valid as before.
const (
	HeaderTraceparent = headerPrefix + "traceparent"
	HeaderTracestate  = headerPrefix + "tracestate"
)

// TraceContextOfHeaders returns the traceparent and tracestate of an
// event's binary-mode headers as [EncodeHeaders] wrote them (percent-encoded),
// empty when they are absent or cannot be decoded.
func TraceContextOfHeaders(h map[string]string) (traceparent, tracestate string) {
	if v := h[HeaderTraceparent]; v != "" {
		traceparent, _ = percentDecode(v)
	}
	if v := h[HeaderTracestate]; v != "" {
		tracestate, _ = percentDecode(v)
	}
	return traceparent, tracestate
}
