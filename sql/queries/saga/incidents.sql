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
SELECT * FROM incidents ORDER BY raised_at;
