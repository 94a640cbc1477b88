-- +goose Up
-- inbox: one row per (consumer, event) handled, written in the same
-- transaction as the handler's effect, so a redelivered or replayed event
-- has no second effect. Keep rows as long as the streams keep events.
CREATE TABLE inbox (
    consumer    text        NOT NULL,
    source      text        NOT NULL,  -- CloudEvents source
    event_id    text        NOT NULL,  -- CloudEvents id
    ce_type     text        NOT NULL,
    stream      text        NOT NULL,
    stream_seq  bigint      NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, source, event_id)
);

-- +goose Down
DROP TABLE inbox;
