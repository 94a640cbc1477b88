-- +goose Up
-- operator_actions: the audit trail of the operators' actions, one row per
-- Idempotency-Key: who asked for what, why and when, and the action event
-- (io.tripsaga.operator.action.v1) written to the outbox in the same
-- transaction. A second request with the key gets the stored event back.
CREATE TABLE operator_actions (
    event_id        text        PRIMARY KEY,
    idempotency_key text        NOT NULL UNIQUE,
    fingerprint     text        NOT NULL,             -- sha256 of the request's fields, hex
    action          text        NOT NULL,
    trip_id         text        NOT NULL,
    service         text        NOT NULL,
    operator        text        NOT NULL,
    reason          text        NOT NULL,
    deadletter_seq  bigint,                           -- redrive: the DEADLETTER sequence
    event           jsonb       NOT NULL,             -- the CloudEvent, structured mode
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operator_actions_trip ON operator_actions (trip_id, created_at);
CREATE INDEX operator_actions_deadletter ON operator_actions (deadletter_seq) WHERE deadletter_seq IS NOT NULL;

-- +goose Down
DROP TABLE operator_actions;
