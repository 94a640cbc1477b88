-- +goose Up
-- The W3C trace context (traceparent, tracestate) of the span that asked
-- for a step (its trigger's consume span) or for its undo (the
-- compensation's), so the company calls made later from the step log (the
-- runner, retries, the recovery pass, verifications) belong to the trip's
-- trace. NULL while tracing is off (internal/tracing).
ALTER TABLE steps ADD COLUMN traceparent text, ADD COLUMN tracestate text;

-- +goose Down
ALTER TABLE steps DROP COLUMN traceparent, DROP COLUMN tracestate;
