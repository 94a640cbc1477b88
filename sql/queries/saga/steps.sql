-- name: StepInsertIfAbsent :execrows
-- Records a step to do, from its trigger event. A row that already exists
-- (a redelivery, or a compensation that arrived first and voided the step)
-- is left alone. The deadline is deadline_ms (milliseconds) after the
-- database's now(): every time of the step log is the database's clock.
INSERT INTO steps (trip_id, step, idempotency_key, request, fingerprint, trip, status, deadline_at,
                   traceparent, tracestate, version)
VALUES (@trip_id, @step, @idempotency_key, @request, @fingerprint, @trip, 'pending',
        now() + make_interval(secs => sqlc.arg(deadline_ms)::float8 / 1000),
        sqlc.narg(traceparent)::text, sqlc.narg(tracestate)::text, @version)
ON CONFLICT (trip_id, step) DO NOTHING;

-- name: StepInsertStarted :one
-- Records a step from its trigger event as already started (attempt 1,
-- leased until next_attempt_at), in the trigger's inbox transaction: the
-- process calls the company right after that commit, so one commit, not
-- two, precedes the call. A row that already exists is left alone (no row
-- returned). Deadline and lease are deadline_ms and lease_ms
-- (milliseconds) after the database's now().
INSERT INTO steps (trip_id, step, idempotency_key, request, fingerprint, trip, status, deadline_at,
                   attempts, started_at, next_attempt_at, owner, traceparent, tracestate, version)
VALUES (@trip_id, @step, @idempotency_key, @request, @fingerprint, @trip, 'started',
        now() + make_interval(secs => sqlc.arg(deadline_ms)::float8 / 1000),
        1, now(), now() + make_interval(secs => sqlc.arg(lease_ms)::float8 / 1000),
        sqlc.narg(owner)::int, sqlc.narg(traceparent)::text, sqlc.narg(tracestate)::text, @version)
ON CONFLICT (trip_id, step) DO NOTHING
RETURNING *;

-- name: StepInsertVoided :execrows
-- The dtm "barrier": an undo that arrives before its forward step leaves a
-- voided row, so the forward step, if it comes later, never runs.
INSERT INTO steps (trip_id, step, idempotency_key, request, fingerprint, trip, status, undo_cause,
                   deadline_at, finished_at, undone_at, outcome, version)
VALUES (@trip_id, @step, @idempotency_key, '{}', '', '{}', 'voided', 'compensation',
        now(), now(), now(), 'undo arrived before the step', @version)
ON CONFLICT (trip_id, step) DO NOTHING;

-- name: StepGetByTripAndName :one
SELECT * FROM steps WHERE trip_id = @trip_id AND step = @step;

-- name: StepGetForUpdate :one
SELECT * FROM steps WHERE trip_id = @trip_id AND step = @step FOR UPDATE;

-- name: StepListByTrip :many
SELECT * FROM steps WHERE trip_id = @trip_id ORDER BY created_at;

-- name: StepListOpen :many
-- The rows whose log says they are unfinished (the steps_due partial
-- index holds exactly these), after the cursor (trip_id, step), in that
-- order: the reconciler's trip list reads them every sweep.
SELECT trip_id, step, status, attempts, undo_attempts, COALESCE(last_error, '')::text AS last_error, status_since,
       EXISTS (SELECT 1 FROM trip_pauses p WHERE p.trip_id = steps.trip_id) AS paused
FROM steps
WHERE status IN ('pending', 'started', 'unknown', 'compensating')
  AND (trip_id, step) > (@after_trip::text, @after_step::text)
ORDER BY trip_id, step
LIMIT @max;

-- name: StepClaimDue :many
-- Rows whose log says they are unfinished and whose time has come. The
-- caller moves next_attempt_at past a lease (and names itself owner) in
-- the same transaction, so a row being worked on is not picked twice; a
-- lease whose owner died is ended early by StepReleaseDeadLeases. Each
-- runner claims only its own step's rows (a service may own several steps:
-- the traveler's cancellation step besides its booking step).
SELECT * FROM steps
WHERE status IN ('pending', 'started', 'unknown', 'compensating')
  AND next_attempt_at <= now()
  AND step = @step
ORDER BY next_attempt_at
LIMIT @max
FOR UPDATE SKIP LOCKED;

-- name: StepClaimVerify :many
-- Undone rows to check again for a company that committed late.
SELECT * FROM steps
WHERE verify_at IS NOT NULL AND verify_at <= now() AND step = @step
ORDER BY verify_at
LIMIT @max
FOR UPDATE SKIP LOCKED;

-- name: StepUpdate :execrows
-- Writes a step row (a trace context given replaces the stored one; none
-- keeps it). With only_if_unchanged it writes only if the row is
-- still as the caller claimed it (same status, attempts, undo attempts and
-- verification time): the answer of a call is recorded without reading the
-- row first, and no row updated means it changed meanwhile (an undo was
-- asked for), so the caller reads it.
--
-- A write that ends the call in flight (owner NULL: the owner records its
-- answer) honours due_after_call, an operator's retry asked for while the
-- call was in flight: the row is due now rather than at next_attempt_at,
-- and the flag is cleared. A write that keeps an owner keeps the flag.
UPDATE steps SET
    status          = @status,
    undo_cause      = @undo_cause,
    company_ref     = @company_ref,
    outcome         = @outcome,
    reason          = @reason,
    attempts        = @attempts,
    undo_attempts   = @undo_attempts,
    next_attempt_at = CASE WHEN due_after_call AND sqlc.narg(owner)::int IS NULL
                           THEN least(@next_attempt_at, now()) ELSE @next_attempt_at END,
    due_after_call  = due_after_call AND sqlc.narg(owner)::int IS NOT NULL,
    verify_at       = @verify_at,
    last_error      = @last_error,
    started_at      = @started_at,
    finished_at     = @finished_at,
    undone_at       = @undone_at,
    owner           = sqlc.narg(owner)::int,
    traceparent     = coalesce(sqlc.narg(traceparent)::text, traceparent),
    tracestate      = CASE WHEN sqlc.narg(traceparent)::text IS NULL THEN tracestate ELSE sqlc.narg(tracestate)::text END,
    updated_at      = now()
WHERE trip_id = @trip_id AND step = @step
  AND (NOT @only_if_unchanged::bool
       OR (status = @was_status AND attempts = @was_attempts AND undo_attempts = @was_undo_attempts
           AND verify_at IS NOT DISTINCT FROM sqlc.narg(was_verify_at)::timestamptz));

-- name: StepCountByStatus :many
SELECT step, status, count(*)::bigint AS n FROM steps GROUP BY step, status ORDER BY step, status;

-- name: StepNextDue :one
-- In how many milliseconds (by the database's clock, 0 when already) the
-- soonest unfinished row is due (a lease's end included), for the runner's
-- sleep; an hour when none is. A duration, not a time: the process sleeps
-- by its own clock, which need not agree with the database's.
SELECT greatest(extract(epoch FROM coalesce(min(t), now() + interval '1 hour') - now()) * 1000, 0)::float8 AS due_in_ms FROM (
    SELECT min(next_attempt_at) AS t FROM steps WHERE status IN ('pending', 'started', 'unknown', 'compensating') AND steps.step = @step::text
    UNION ALL
    SELECT min(verify_at) FROM steps WHERE verify_at IS NOT NULL AND steps.step = @step::text
) AS due;

-- name: StepRenewLease :one
-- Renews the lease of a claimed row whose call waited for a free call slot
-- (so that what is left of the lease covers the calls), only if the row is
-- still as claimed (lease included); no row means another process took it
-- or an undo was asked for, and the call is not made. The new lease ends
-- lease_ms (milliseconds) after the database's now(); it is returned.
UPDATE steps SET next_attempt_at = now() + make_interval(secs => sqlc.arg(lease_ms)::float8 / 1000)
WHERE trip_id = @trip_id AND step = @step AND status = @status
  AND attempts = @attempts AND undo_attempts = @undo_attempts
  AND next_attempt_at = @was_lease
RETURNING next_attempt_at;

-- name: DBClock :one
-- The database's clock, which decides every lease, backoff and deadline of
-- the step log: now() (the transaction's start, as the claims' now() sees
-- it) and clock_timestamp() (the moment of this statement, to estimate the
-- database's clock between statements).
SELECT now()::timestamptz AS tx_now, clock_timestamp()::timestamptz AS at;
