-- name: IncidentRaise :one
-- Raises (or refreshes) the open incident of a step. inserted tells whether
-- this call raised it, so it is logged once.
INSERT INTO incidents (trip_id, step, kind, attempts, last_error)
VALUES (@trip_id, @step, @kind, @attempts, @last_error)
ON CONFLICT (trip_id, step, kind) DO UPDATE
    SET attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error
RETURNING (xmax = 0) AS inserted;

-- name: IncidentResolve :exec
UPDATE incidents SET resolved_at = now()
WHERE trip_id = @trip_id AND step = @step AND resolved_at IS NULL;

-- name: IncidentListOpen :many
SELECT * FROM incidents WHERE resolved_at IS NULL ORDER BY raised_at;

-- name: IncidentListAll :many
-- Every incident, with its step's calls made now (its undo's for an
-- undo's incident): attempts is the count when it was raised or last
-- refreshed.
SELECT i.id, i.trip_id, i.step, i.kind, i.attempts, i.last_error, i.raised_at, i.resolved_at, i.resolved_by, i.resolution,
       COALESCE(CASE WHEN i.kind LIKE 'compensation%' THEN s.undo_attempts ELSE s.attempts END, i.attempts)::int AS attempts_now
FROM incidents i LEFT JOIN steps s ON s.trip_id = i.trip_id AND s.step = i.step
ORDER BY i.raised_at;
