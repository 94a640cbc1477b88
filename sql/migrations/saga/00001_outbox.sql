-- +goose Up
-- outbox: events written in the same transaction as the state change they
-- report, published to JetStream by the relay (outbox.Relay).
CREATE TABLE outbox (
    id              bigserial   PRIMARY KEY,
    event_id        text        NOT NULL UNIQUE,      -- CloudEvents id, also Nats-Msg-Id
    nats_subject    text        NOT NULL,
    headers         jsonb       NOT NULL,             -- ce-* headers, already encoded
    data            bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    quarantined_at  timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (next_attempt_at, id)
    WHERE published_at IS NULL AND quarantined_at IS NULL;

-- +goose Down
DROP TABLE outbox;
