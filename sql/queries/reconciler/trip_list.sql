-- The trip list (GET /api/trips) and the bulk actions' selection. Every
-- filter is optional (NULL: not filtered); run them with
-- plan_cache_mode = force_custom_plan, so that PostgreSQL plans each call
-- with its values and an unset filter costs nothing (a generic plan would
-- keep every "IS NULL OR" and scan). The finding filter is an array of
-- the (few) open findings' trips, looked up by primary key, rather than
-- an EXISTS the planner would probe row by row in age order. A filter on the open step (step,
-- state, company, attempts, error) makes the join an inner one, driven
-- from the small open_steps table; status and age walk
-- trip_view_status_age or trip_view_newest in order.

-- name: TripListOldest :many
SELECT v.trip_id, v.status, v.settled, v.version, v.first_event_at, v.last_event_at, v.events, v.seen,
       o.service AS open_service, o.step AS open_step, o.state AS open_state, o.attempts AS open_attempts,
       o.last_error AS open_error, o.since AS open_since, o.paused AS open_paused,
       COALESCE((SELECT string_agg(f.kind, ',' ORDER BY f.kind) FROM findings f
                 WHERE f.trip_id = v.trip_id AND f.resolved_at IS NULL AND f.dismissed_at IS NULL), '')::text AS findings
FROM trip_view v LEFT JOIN open_steps o ON o.trip_id = v.trip_id
WHERE (sqlc.narg(status)::text IS NULL OR v.status = sqlc.narg(status)::text)
  AND (sqlc.narg(version)::text IS NULL OR v.version = sqlc.narg(version)::text)
  AND (sqlc.narg(from_at)::timestamptz IS NULL OR v.first_event_at >= sqlc.narg(from_at)::timestamptz)
  AND (sqlc.narg(to_at)::timestamptz IS NULL OR v.first_event_at < sqlc.narg(to_at)::timestamptz)
  AND (sqlc.narg(min_age_ms)::bigint IS NULL OR v.first_event_at <= now() - sqlc.narg(min_age_ms)::bigint * interval '1 millisecond')
  AND (sqlc.narg(step)::text IS NULL OR o.step = sqlc.narg(step)::text)
  AND (sqlc.narg(state)::text IS NULL OR o.state = sqlc.narg(state)::text)
  AND (sqlc.narg(company)::text IS NULL OR o.service = sqlc.narg(company)::text)
  AND (sqlc.narg(min_attempts)::int IS NULL OR o.attempts >= sqlc.narg(min_attempts)::int)
  AND (sqlc.narg(paused)::boolean IS NULL OR o.paused = sqlc.narg(paused)::boolean)
  AND (sqlc.narg(error)::text IS NULL OR strpos(lower(o.last_error), lower(sqlc.narg(error)::text)) > 0)
  AND (sqlc.narg(finding)::text IS NULL OR v.trip_id = ANY(ARRAY(
        SELECT f.trip_id FROM findings f WHERE f.kind = sqlc.narg(finding)::text
          AND f.resolved_at IS NULL AND f.dismissed_at IS NULL)))
  AND (sqlc.narg(after_at)::timestamptz IS NULL
       OR (v.first_event_at, v.trip_id) > (sqlc.narg(after_at)::timestamptz, sqlc.narg(after_id)::text))
ORDER BY v.first_event_at, v.trip_id
LIMIT @max;

-- name: TripListNewest :many
SELECT v.trip_id, v.status, v.settled, v.version, v.first_event_at, v.last_event_at, v.events, v.seen,
       o.service AS open_service, o.step AS open_step, o.state AS open_state, o.attempts AS open_attempts,
       o.last_error AS open_error, o.since AS open_since, o.paused AS open_paused,
       COALESCE((SELECT string_agg(f.kind, ',' ORDER BY f.kind) FROM findings f
                 WHERE f.trip_id = v.trip_id AND f.resolved_at IS NULL AND f.dismissed_at IS NULL), '')::text AS findings
FROM trip_view v LEFT JOIN open_steps o ON o.trip_id = v.trip_id
WHERE (sqlc.narg(status)::text IS NULL OR v.status = sqlc.narg(status)::text)
  AND (sqlc.narg(version)::text IS NULL OR v.version = sqlc.narg(version)::text)
  AND (sqlc.narg(from_at)::timestamptz IS NULL OR v.first_event_at >= sqlc.narg(from_at)::timestamptz)
  AND (sqlc.narg(to_at)::timestamptz IS NULL OR v.first_event_at < sqlc.narg(to_at)::timestamptz)
  AND (sqlc.narg(min_age_ms)::bigint IS NULL OR v.first_event_at <= now() - sqlc.narg(min_age_ms)::bigint * interval '1 millisecond')
  AND (sqlc.narg(step)::text IS NULL OR o.step = sqlc.narg(step)::text)
  AND (sqlc.narg(state)::text IS NULL OR o.state = sqlc.narg(state)::text)
  AND (sqlc.narg(company)::text IS NULL OR o.service = sqlc.narg(company)::text)
  AND (sqlc.narg(min_attempts)::int IS NULL OR o.attempts >= sqlc.narg(min_attempts)::int)
  AND (sqlc.narg(paused)::boolean IS NULL OR o.paused = sqlc.narg(paused)::boolean)
  AND (sqlc.narg(error)::text IS NULL OR strpos(lower(o.last_error), lower(sqlc.narg(error)::text)) > 0)
  AND (sqlc.narg(finding)::text IS NULL OR v.trip_id = ANY(ARRAY(
        SELECT f.trip_id FROM findings f WHERE f.kind = sqlc.narg(finding)::text
          AND f.resolved_at IS NULL AND f.dismissed_at IS NULL)))
  AND (sqlc.narg(after_at)::timestamptz IS NULL
       OR (v.first_event_at, v.trip_id) < (sqlc.narg(after_at)::timestamptz, sqlc.narg(after_id)::text))
ORDER BY v.first_event_at DESC, v.trip_id DESC
LIMIT @max;

-- name: TripListCount :one
SELECT count(*) FROM trip_view v LEFT JOIN open_steps o ON o.trip_id = v.trip_id
WHERE (sqlc.narg(status)::text IS NULL OR v.status = sqlc.narg(status)::text)
  AND (sqlc.narg(version)::text IS NULL OR v.version = sqlc.narg(version)::text)
  AND (sqlc.narg(from_at)::timestamptz IS NULL OR v.first_event_at >= sqlc.narg(from_at)::timestamptz)
  AND (sqlc.narg(to_at)::timestamptz IS NULL OR v.first_event_at < sqlc.narg(to_at)::timestamptz)
  AND (sqlc.narg(min_age_ms)::bigint IS NULL OR v.first_event_at <= now() - sqlc.narg(min_age_ms)::bigint * interval '1 millisecond')
  AND (sqlc.narg(step)::text IS NULL OR o.step = sqlc.narg(step)::text)
  AND (sqlc.narg(state)::text IS NULL OR o.state = sqlc.narg(state)::text)
  AND (sqlc.narg(company)::text IS NULL OR o.service = sqlc.narg(company)::text)
  AND (sqlc.narg(min_attempts)::int IS NULL OR o.attempts >= sqlc.narg(min_attempts)::int)
  AND (sqlc.narg(paused)::boolean IS NULL OR o.paused = sqlc.narg(paused)::boolean)
  AND (sqlc.narg(error)::text IS NULL OR strpos(lower(o.last_error), lower(sqlc.narg(error)::text)) > 0)
  AND (sqlc.narg(finding)::text IS NULL OR v.trip_id = ANY(ARRAY(
        SELECT f.trip_id FROM findings f WHERE f.kind = sqlc.narg(finding)::text
          AND f.resolved_at IS NULL AND f.dismissed_at IS NULL)));

-- name: PlanCacheCustom :exec
-- For the transaction of a trip list query (see above).
SET LOCAL plan_cache_mode = force_custom_plan;

-- name: OpenStepUpsertMany :exec
-- The open step of each trip, as the last read of the services found it.
INSERT INTO open_steps AS o (trip_id, service, step, state, attempts, last_error, since, paused, read_at)
SELECT u.trip_id, u.service, u.step, u.state, u.attempts, u.last_error, u.since, u.paused, @read_at::timestamptz
FROM (SELECT unnest(@trip_ids::text[]) AS trip_id, unnest(@services::text[]) AS service, unnest(@steps::text[]) AS step,
             unnest(@states::text[]) AS state, unnest(@attempts::int[]) AS attempts,
             unnest(@last_errors::text[]) AS last_error, unnest(@sinces::timestamptz[]) AS since,
             unnest(@pauseds::boolean[]) AS paused) AS u
ON CONFLICT (trip_id) DO UPDATE
SET service = EXCLUDED.service, step = EXCLUDED.step, state = EXCLUDED.state, attempts = EXCLUDED.attempts,
    last_error = EXCLUDED.last_error, since = EXCLUDED.since, paused = EXCLUDED.paused, read_at = EXCLUDED.read_at;

-- name: OpenStepDeleteOthers :execrows
-- Ends the rows of the services that answered (services) whose trip they
-- no longer list (keep): those steps are final now. Rows of a service
-- that did not answer stay.
DELETE FROM open_steps WHERE service = ANY(@services::text[]) AND NOT (trip_id = ANY(@keep::text[]));

-- name: OpenStepCount :one
SELECT count(*) FROM open_steps;

-- name: TripListSelect :many
-- The trips a bulk action takes: the filter's, oldest first, at most max
-- (the caller asks one more than it allows, to refuse a larger set), with
-- the company of each one's open step ('' when none).
SELECT v.trip_id, COALESCE(o.service, '')::text AS open_service
FROM trip_view v LEFT JOIN open_steps o ON o.trip_id = v.trip_id
WHERE (sqlc.narg(status)::text IS NULL OR v.status = sqlc.narg(status)::text)
  AND (sqlc.narg(version)::text IS NULL OR v.version = sqlc.narg(version)::text)
  AND (sqlc.narg(from_at)::timestamptz IS NULL OR v.first_event_at >= sqlc.narg(from_at)::timestamptz)
  AND (sqlc.narg(to_at)::timestamptz IS NULL OR v.first_event_at < sqlc.narg(to_at)::timestamptz)
  AND (sqlc.narg(min_age_ms)::bigint IS NULL OR v.first_event_at <= now() - sqlc.narg(min_age_ms)::bigint * interval '1 millisecond')
  AND (sqlc.narg(step)::text IS NULL OR o.step = sqlc.narg(step)::text)
  AND (sqlc.narg(state)::text IS NULL OR o.state = sqlc.narg(state)::text)
  AND (sqlc.narg(company)::text IS NULL OR o.service = sqlc.narg(company)::text)
  AND (sqlc.narg(min_attempts)::int IS NULL OR o.attempts >= sqlc.narg(min_attempts)::int)
  AND (sqlc.narg(paused)::boolean IS NULL OR o.paused = sqlc.narg(paused)::boolean)
  AND (sqlc.narg(error)::text IS NULL OR strpos(lower(o.last_error), lower(sqlc.narg(error)::text)) > 0)
  AND (sqlc.narg(finding)::text IS NULL OR v.trip_id = ANY(ARRAY(
        SELECT f.trip_id FROM findings f WHERE f.kind = sqlc.narg(finding)::text
          AND f.resolved_at IS NULL AND f.dismissed_at IS NULL)))
ORDER BY v.first_event_at, v.trip_id
LIMIT @max;
