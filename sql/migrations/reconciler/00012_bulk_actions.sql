-- +goose Up
-- bulk_actions: an operator's action applied to every trip a trip-list
-- filter matched (POST /api/bulk-actions), one row per Idempotency-Key:
-- the bulk action's audit record. Its trips were fixed when it was
-- created (bulk_action_trips), after the operator confirmed their count,
-- so the set cannot grow behind them. Each trip's action is an ordinary
-- operator action (operator_actions, its key "<key>/<trip>"), so it acts
-- once however often it is sent.
--   state: canary (the first canary trips, then stop if any failed)
--          -> running -> done | stopped (the canary failed) | canceled
CREATE TABLE bulk_actions (
    id              text        PRIMARY KEY,          -- "B-<ULID>"
    idempotency_key text        NOT NULL UNIQUE,
    fingerprint     text        NOT NULL,             -- sha256 of the request's fields, hex
    action          text        NOT NULL,
    service         text        NOT NULL,             -- '': each trip's open step's company
    incident        text        NOT NULL DEFAULT '',  -- resolve: the incident kind
    outcome         text        NOT NULL DEFAULT '',  -- settle: the outcome
    step            text        NOT NULL DEFAULT '',  -- settle: the step; redrive: the step to re-drive from
    filter          jsonb       NOT NULL,             -- the trip list's fields
    trips           integer     NOT NULL,             -- the count the operator confirmed
    rate_per_s      double precision NOT NULL,        -- actions per second per company; 0: no limit
    canary          integer     NOT NULL,             -- 0: none
    operator        text        NOT NULL,
    reason          text        NOT NULL,
    state           text        NOT NULL,
    state_reason    text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX bulk_actions_active ON bulk_actions (created_at) WHERE finished_at IS NULL;

-- bulk_action_trips: each trip of a bulk action and where its action is.
--   state: waiting -> sent (recorded, its event on OPERATOR) -> done | failed
--          waiting -> skipped (canceled or stopped before it was sent)
CREATE TABLE bulk_action_trips (
    bulk_id     text        NOT NULL REFERENCES bulk_actions (id),
    trip_id     text        NOT NULL,
    position    integer     NOT NULL,                 -- order of sending: oldest trip first
    service     text        NOT NULL,                 -- who carries it out
    state       text        NOT NULL DEFAULT 'waiting',
    event_id    text,                                 -- the trip's operator action
    effect      text        NOT NULL DEFAULT '',      -- what the service reported, or why it failed
    sent_at     timestamptz,
    finished_at timestamptz,
    PRIMARY KEY (bulk_id, trip_id)
);
CREATE INDEX bulk_action_trips_next ON bulk_action_trips (bulk_id, state, position);
CREATE INDEX bulk_action_trips_sent ON bulk_action_trips (bulk_id, service, sent_at) WHERE sent_at IS NOT NULL;

-- +goose Down
DROP TABLE bulk_action_trips;
DROP TABLE bulk_actions;
