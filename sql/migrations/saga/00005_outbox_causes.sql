-- +goose Up
-- Why a row is not published yet. A refusal of the event itself (its size,
-- its headers) counts in `attempts` towards quarantine; a failure that comes
-- from the server's state (storage or limits exceeded, no stream for the
-- subject, no leader, no PubAck in time, no connection) is an outage: it is
-- counted in `outages` for the row's backoff only and never quarantines.
ALTER TABLE outbox
    ADD COLUMN last_cause     text,        -- refused | storage | limits | no_stream | no_leader | timeout | disconnected | server
    ADD COLUMN outages        integer     NOT NULL DEFAULT 0,
    ADD COLUMN last_failed_at timestamptz,
    ADD COLUMN redriven_at    timestamptz; -- last `tripsaga outbox redrive`

-- +goose Down
ALTER TABLE outbox
    DROP COLUMN last_cause,
    DROP COLUMN outages,
    DROP COLUMN last_failed_at,
    DROP COLUMN redriven_at;
