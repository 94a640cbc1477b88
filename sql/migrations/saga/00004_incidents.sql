-- +goose Up
-- incidents: named problems raised for a person, e.g. a compensation that
-- still fails after the configured number of attempts. Retries go on.
CREATE TABLE incidents (
    id          bigserial   PRIMARY KEY,
    trip_id     text        NOT NULL,
    step        text        NOT NULL,
    kind        text        NOT NULL,   -- compensation_stuck | forward_stuck | forward_refused
    attempts    integer     NOT NULL,
    last_error  text        NOT NULL,
    raised_at   timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz,
    UNIQUE (trip_id, step, kind)
);

-- +goose Down
DROP TABLE incidents;
