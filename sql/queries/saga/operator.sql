-- name: TripPauseInsert :execrows
INSERT INTO trip_pauses (trip_id, operator, reason, event_id)
VALUES (@trip_id, @operator, @reason, @event_id)
ON CONFLICT (trip_id) DO NOTHING;

-- name: TripPauseDelete :execrows
DELETE FROM trip_pauses WHERE trip_id = @trip_id;

-- name: TripPausedAmong :many
-- The paused trips among trip_ids.
SELECT trip_id FROM trip_pauses WHERE trip_id = ANY(@trip_ids::text[]);

-- name: TripPauseGet :one
SELECT * FROM trip_pauses WHERE trip_id = @trip_id;

-- name: StepPostpone :exec
-- Moves the unfinished rows of paused trips, claimed due, out of the claims
-- for after_ms (milliseconds, by the database's clock; the runner looks at
-- them again then, and finds them paused or not). A live lease owned by a
-- process (a call in flight) is never moved.
UPDATE steps SET next_attempt_at = now() + make_interval(secs => sqlc.arg(after_ms)::float8 / 1000)
WHERE trip_id = ANY(@trip_ids::text[]) AND step = @step
  AND status IN ('pending', 'started', 'unknown', 'compensating')
  AND NOT (owner IS NOT NULL AND next_attempt_at > now());

-- name: StepPostponeVerify :exec
UPDATE steps SET verify_at = now() + make_interval(secs => sqlc.arg(after_ms)::float8 / 1000)
WHERE trip_id = ANY(@trip_ids::text[]) AND step = @step AND verify_at IS NOT NULL
  AND NOT (owner IS NOT NULL AND verify_at > now());

-- name: StepDueNow :many
-- Makes the trip's unfinished rows due now, except a row whose call is in
-- flight (its lease live and owned by a process): its lease is left as it
-- is, so no second call of its Idempotency-Key starts, and due_after_call
-- makes it due as soon as the owner writes that call's answer. A started
-- row with no owner is left alone (a runner without liveness has its call
-- in flight). One row per row changed, saying which of the two it got.
UPDATE steps SET
    due_after_call  = (owner IS NOT NULL AND next_attempt_at > now()),
    next_attempt_at = CASE WHEN owner IS NOT NULL AND next_attempt_at > now() THEN next_attempt_at
                           ELSE least(next_attempt_at, now()) END
WHERE trip_id = @trip_id
  AND (status IN ('pending', 'unknown', 'compensating') OR (status = 'started' AND owner IS NOT NULL))
RETURNING step, due_after_call;

-- name: StepInsertOperatorUndo :execrows
-- A step the service has no row of (an orphan record at the company): a
-- row to undo by key, for an operator.
INSERT INTO steps (trip_id, step, idempotency_key, request, fingerprint, trip, status, undo_cause,
                   deadline_at, next_attempt_at, outcome)
VALUES (@trip_id, @step, @idempotency_key, '{}', '', '{}', 'compensating', 'operator',
        now(), now(), 'an operator asked to undo a leaked record')
ON CONFLICT (trip_id, step) DO NOTHING;

-- name: IncidentResolveByOperator :execrows
-- Resolves the trip's open incidents (of one kind, unless kind is '')
-- with who and why.
UPDATE incidents SET resolved_at = now(), resolved_by = @operator, resolution = @reason
WHERE trip_id = @trip_id AND resolved_at IS NULL AND (@kind::text = '' OR kind = @kind::text);

-- name: OperatorLogInsert :exec
INSERT INTO operator_log (event_id, trip_id, action, operator, reason, effect)
VALUES (@event_id, @trip_id, @action, @operator, @reason, @effect)
ON CONFLICT (event_id) DO NOTHING;

-- name: OperatorLogListByTrip :many
SELECT * FROM operator_log WHERE trip_id = @trip_id ORDER BY at, event_id;

-- name: IncidentKindsOfStep :many
-- The kinds of incident the trip's step ever raised (open or resolved):
-- whether it got stuck, for an operator's settle.
SELECT kind FROM incidents WHERE trip_id = @trip_id AND step = @step ORDER BY raised_at;

-- name: IncidentResolveStepByOperator :execrows
-- Resolves the open incidents of one step of the trip with who and why
-- (an operator settled the step by hand).
UPDATE incidents SET resolved_at = now(), resolved_by = @operator, resolution = @reason
WHERE trip_id = @trip_id AND step = @step AND resolved_at IS NULL;
