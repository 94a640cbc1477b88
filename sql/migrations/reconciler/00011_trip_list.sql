-- +goose Up
-- open_steps: the step each unsettled trip waits on, as the services' step
-- logs said at the last sweep (GET /steps?open=1 of every service): one
-- row per trip, the step whose row is not final, compensating before
-- unknown before started before pending when a trip has several. It is a
-- copy of the services' state, not a projection of events: a replay does
-- not rebuild it, the next sweep does. Rows of a service that did not
-- answer are kept as they were (read_at says how old they are).
--   state:    pending | started | unknown | compensating (saga step log)
--   attempts: the calls of what is being tried now (the undo's calls
--             while compensating, else the forward calls)
--   since:    when the step's row took that state (steps.status_since)
CREATE TABLE open_steps (
    trip_id    text        PRIMARY KEY,
    service    text        NOT NULL,
    step       text        NOT NULL,
    state      text        NOT NULL,
    attempts   integer     NOT NULL,
    last_error text        NOT NULL DEFAULT '',
    since      timestamptz NOT NULL,
    paused     boolean     NOT NULL DEFAULT false, -- an operator paused the trip's calls at that service
    read_at    timestamptz NOT NULL
);
CREATE INDEX open_steps_step ON open_steps (step, state);
CREATE INDEX open_steps_service ON open_steps (service, state);

-- The trip list (GET /api/trips) pages trips by age within a status.
CREATE INDEX trip_view_status_age ON trip_view (status, first_event_at, trip_id);
CREATE INDEX findings_open_kind ON findings (kind, trip_id) WHERE resolved_at IS NULL;

-- +goose Down
DROP INDEX findings_open_kind;
DROP INDEX trip_view_status_age;
DROP TABLE open_steps;
