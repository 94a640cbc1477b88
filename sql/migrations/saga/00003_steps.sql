-- +goose Up
-- steps: the step log. A row is written before the company is called and
-- updated with what came back; the recovery pass finishes every row whose
-- status is not final.
--
-- status: pending -> started -> unknown* -> done | rejected
--         done -> compensating -> compensated          (undo asked for)
--         started|unknown -> compensating -> failed     (unknown at deadline)
--         (no row) + undo asked -> voided               (undo before forward)
CREATE TABLE steps (
    trip_id         text        NOT NULL,
    step            text        NOT NULL,
    idempotency_key text        NOT NULL UNIQUE,
    request         jsonb       NOT NULL,              -- body sent to the company
    fingerprint     text        NOT NULL,              -- sha256 of request, hex
    trip            jsonb       NOT NULL,              -- the trip request, carried forward in events
    status          text        NOT NULL,
    undo_cause      text,                              -- compensation | deadline
    company_ref     text,                              -- the company's id (hold_id, charge_id, ...)
    outcome         text,                              -- what came back last, e.g. "201 held", "timeout"
    reason          text,                              -- business reason of a rejection
    attempts        integer     NOT NULL DEFAULT 0,    -- forward calls made
    undo_attempts   integer     NOT NULL DEFAULT 0,    -- undo calls made
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    deadline_at     timestamptz NOT NULL,              -- unknown past this is undone
    verify_at       timestamptz,                       -- re-check for a late commit after an undo
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    undone_at       timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trip_id, step)
);
CREATE INDEX steps_due ON steps (next_attempt_at)
    WHERE status IN ('pending', 'started', 'unknown', 'compensating');
CREATE INDEX steps_verify ON steps (verify_at) WHERE verify_at IS NOT NULL;

-- +goose Down
DROP TABLE steps;
