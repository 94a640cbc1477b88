-- name: TripInsert :one
-- No row comes back when a trip with the same idempotency key exists.
INSERT INTO trips (trip_id, idempotency_key, fingerprint, request, status, version)
VALUES (@trip_id, @idempotency_key, @fingerprint, @request, 'pending', @version)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING *;

-- name: TripGet :one
SELECT * FROM trips WHERE trip_id = @trip_id;

-- name: TripGetByIdempotencyKey :one
SELECT * FROM trips WHERE idempotency_key = @idempotency_key;

-- name: TripSeeEvent :one
-- Adds an event kind to a trip's set of kinds seen, and its failure reason
-- when the trip has none yet, and returns the row (locked until the
-- transaction ends); the caller derives the status and sets it with
-- TripSetStatus only when it changes.
UPDATE trips
SET seen = CASE WHEN @kind::text = ANY(seen) THEN seen ELSE seen || @kind::text END,
    reason = coalesce(reason, sqlc.narg(reason)::text),
    updated_at = now()
WHERE trip_id = @trip_id
RETURNING *;

-- name: TripSetStatus :one
-- Sets a trip's status; settle stamps settled_at with the database's now(),
-- the clock that stamped created_at, so how long a trip took is measured
-- by one clock; the first change to canceling stamps canceling_since (the
-- delay notice's clock). Returns the stamps as written.
UPDATE trips SET status = @status,
    settled_at = CASE WHEN @settle::bool THEN now() ELSE settled_at END,
    canceling_since = CASE WHEN @status::text = 'canceling' THEN coalesce(canceling_since, now()) ELSE canceling_since END,
    updated_at = now()
WHERE trip_id = @trip_id
RETURNING settled_at, updated_at;

-- name: TripList :many
-- Newest first (trip ids are ULIDs, so they sort by creation time).
SELECT * FROM trips
WHERE (sqlc.narg(status)::text IS NULL OR status = sqlc.narg(status)::text)
  AND (sqlc.narg(before)::text IS NULL OR trip_id < sqlc.narg(before)::text)
ORDER BY trip_id DESC
LIMIT @max;

-- name: TripNotifySettled :exec
-- Tells every trips replica (LISTEN trip_settled_<schema>) that a trip
-- settled, at commit, so a request waiting on it (Prefer: wait) wakes
-- whichever replica projected the event. The payload is
-- "<trip_id> <sender>": the sending replica wakes its own waiters itself
-- after the commit (with the row), so it ignores its own notifications.
SELECT pg_notify('trip_settled_' || current_schema(), @trip_id::text || ' ' || @sender::text);
