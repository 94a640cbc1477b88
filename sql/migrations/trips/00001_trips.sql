-- +goose Up
-- trips: the trips service's projection of every trip, updated from the
-- steps' events. seen is the set of event kinds seen (e.g. "hotel.held"),
-- so the status is the same whatever order the events arrive in.
CREATE TABLE trips (
    trip_id         text        PRIMARY KEY,
    idempotency_key text        UNIQUE,
    fingerprint     text        NOT NULL,
    request         jsonb       NOT NULL,
    status          text        NOT NULL,   -- pending | confirmed | canceling | canceled
    reason          text,
    seen            text[]      NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    settled_at      timestamptz
);
CREATE INDEX trips_status_created ON trips (status, created_at DESC, trip_id DESC);
CREATE INDEX trips_created ON trips (created_at DESC, trip_id DESC);

-- +goose Down
DROP TABLE trips;
