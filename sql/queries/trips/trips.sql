-- name: TripInsert :one
-- No row comes back when a trip with the same idempotency key exists.
INSERT INTO trips (trip_id, idempotency_key, fingerprint, request, status)
VALUES (@trip_id, @idempotency_key, @fingerprint, @request, 'pending')
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING *;

-- name: TripGet :one
SELECT * FROM trips WHERE trip_id = @trip_id;

-- name: TripGetByIdempotencyKey :one
SELECT * FROM trips WHERE idempotency_key = @idempotency_key;

-- name: TripGetForUpdate :one
SELECT * FROM trips WHERE trip_id = @trip_id FOR UPDATE;

-- name: TripUpdateProjection :exec
UPDATE trips
SET status = @status, reason = @reason, seen = @seen, settled_at = @settled_at, updated_at = now()
WHERE trip_id = @trip_id;

-- name: TripList :many
-- Newest first (trip ids are ULIDs, so they sort by creation time).
SELECT * FROM trips
WHERE (sqlc.narg(status)::text IS NULL OR status = sqlc.narg(status)::text)
  AND (sqlc.narg(before)::text IS NULL OR trip_id < sqlc.narg(before)::text)
ORDER BY trip_id DESC
LIMIT @max;
