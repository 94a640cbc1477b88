-- +goose Up
-- findings: what the sweep found wrong, one row per (trip, kind) while it
-- stays true. A finding that stops being true gets resolved_at; if it comes
-- back later it is a new row.
--   half:   a settled trip whose company records disagree with it
--   orphan: an active company record whose trip was never requested
--   stuck:  a trip not settled whose last event is older than the limit
CREATE TABLE findings (
    id          bigserial   PRIMARY KEY,
    trip_id     text        NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('half', 'orphan', 'stuck')),
    detail      text        NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz
);
CREATE UNIQUE INDEX findings_open ON findings (trip_id, kind) WHERE resolved_at IS NULL;
CREATE INDEX findings_trip ON findings (trip_id, first_seen);

-- +goose Down
DROP TABLE findings;
