-- name: BulkGetByKey :one
SELECT * FROM bulk_actions WHERE idempotency_key = @idempotency_key;

-- name: BulkGet :one
SELECT * FROM bulk_actions WHERE id = @id;

-- name: BulkInsert :execrows
INSERT INTO bulk_actions (id, idempotency_key, fingerprint, action, service, incident, outcome, step, filter, trips,
                          rate_per_s, canary, operator, reason, state)
VALUES (@id, @idempotency_key, @fingerprint, @action, @service, @incident, @outcome, @step, @filter, @trips,
        @rate_per_s, @canary, @operator, @reason, @state)
ON CONFLICT (idempotency_key) DO NOTHING;

-- name: BulkTripInsertMany :exec
INSERT INTO bulk_action_trips (bulk_id, trip_id, position, service, state, effect)
SELECT @bulk_id, t.trip_id, t.position, t.service, t.state, t.effect
FROM (SELECT unnest(@trip_ids::text[]) AS trip_id, unnest(@positions::int[]) AS position,
             unnest(@services::text[]) AS service, unnest(@states::text[]) AS state,
             unnest(@effects::text[]) AS effect) AS t;

-- name: BulkList :many
SELECT * FROM bulk_actions ORDER BY created_at DESC LIMIT @max;

-- name: BulkClaimActive :many
-- The bulk actions with work left (trips to send, or sent trips whose
-- outcome is not in), locked for this pass; another replica's pass skips
-- them.
SELECT * FROM bulk_actions b
WHERE b.finished_at IS NULL
   OR EXISTS (SELECT 1 FROM bulk_action_trips t WHERE t.bulk_id = b.id AND t.state = 'sent')
ORDER BY b.created_at
FOR UPDATE SKIP LOCKED;

-- name: BulkSetState :exec
UPDATE bulk_actions SET state = @state, state_reason = @state_reason,
    finished_at = CASE WHEN @finished::boolean THEN COALESCE(finished_at, now()) ELSE finished_at END
WHERE id = @id;

-- name: BulkTripCounts :many
SELECT state, count(*) AS trips FROM bulk_action_trips WHERE bulk_id = @bulk_id GROUP BY state ORDER BY state;

-- name: BulkTripList :many
SELECT * FROM bulk_action_trips WHERE bulk_id = @bulk_id ORDER BY position LIMIT @max;

-- name: BulkTripsSent :many
SELECT * FROM bulk_action_trips WHERE bulk_id = @bulk_id AND state = 'sent' ORDER BY position LIMIT @max;

-- name: BulkTripsWaiting :many
SELECT * FROM bulk_action_trips WHERE bulk_id = @bulk_id AND state = 'waiting' AND position < @below
ORDER BY position LIMIT @max;

-- name: BulkSentSince :many
-- Per company, the trips of the bulk action sent since a moment (the
-- rate limit's window).
SELECT service, count(*) AS sent FROM bulk_action_trips
WHERE bulk_id = @bulk_id AND sent_at > @since::timestamptz GROUP BY service;

-- name: BulkTripSent :exec
UPDATE bulk_action_trips SET state = 'sent', event_id = @event_id, sent_at = now()
WHERE bulk_id = @bulk_id AND trip_id = @trip_id AND state = 'waiting';

-- name: BulkTripFinish :exec
UPDATE bulk_action_trips SET state = @state, effect = @effect, finished_at = now()
WHERE bulk_id = @bulk_id AND trip_id = @trip_id AND state IN ('waiting', 'sent');

-- name: BulkTripSkipWaiting :execrows
UPDATE bulk_action_trips SET state = 'skipped', effect = @effect, finished_at = now()
WHERE bulk_id = @bulk_id AND state = 'waiting';
