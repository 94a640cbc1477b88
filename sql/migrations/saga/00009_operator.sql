-- +goose Up
-- The operators' actions as a service carries them out (events
-- io.tripsaga.operator.action.v1 that name it).
--
-- trip_pauses: trips whose company calls an operator paused: the runner
-- claims none of their rows (retries, undos, late-commit checks) until the
-- pause is lifted (resume, or retry_undo).
CREATE TABLE trip_pauses (
    trip_id   text        PRIMARY KEY,
    operator  text        NOT NULL,
    reason    text        NOT NULL,
    event_id  text        NOT NULL,            -- the pause action's event
    paused_at timestamptz NOT NULL DEFAULT now()
);

-- operator_log: every action carried out here, beside the step log: who,
-- what, why, when, and what it did (effect), one row per action event.
CREATE TABLE operator_log (
    event_id  text        PRIMARY KEY,
    trip_id   text        NOT NULL,
    action    text        NOT NULL,
    operator  text        NOT NULL,
    reason    text        NOT NULL,
    effect    text        NOT NULL,
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operator_log_trip ON operator_log (trip_id, at);

-- An incident an operator resolved says who and why.
ALTER TABLE incidents ADD COLUMN resolved_by text, ADD COLUMN resolution text;

-- +goose Down
ALTER TABLE incidents DROP COLUMN resolved_by, DROP COLUMN resolution;
DROP TABLE operator_log;
DROP TABLE trip_pauses;
