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
-- Moves the unfinished rows of paused trips out of the claims until at
-- (the runner looks at them again then, and finds them paused or not).
UPDATE steps SET next_attempt_at = @at
WHERE trip_id = ANY(@trip_ids::text[]) AND step = @step
  AND status IN ('pending', 'started', 'unknown', 'compensating');

-- name: StepPostponeVerify :exec
UPDATE steps SET verify_at = @at
WHERE trip_id = ANY(@trip_ids::text[]) AND step = @step AND verify_at IS NOT NULL;

-- name: StepDueNow :execrows
-- Makes the trip's unfinished rows due now (a call in flight keeps its
-- lease: started rows are left alone).
UPDATE steps SET next_attempt_at = now()
WHERE trip_id = @trip_id AND status IN ('pending', 'unknown', 'compensating');

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
