-- name: RecordInsert :one
INSERT INTO records (key, id, trip_id, status, request, reason)
VALUES (@key, @id, @trip_id, @status, @request, sqlc.narg(reason))
RETURNING *;

-- name: RecordGetByKey :one
SELECT * FROM records WHERE key = @key;

-- name: RecordGetByKeyForUpdate :one
SELECT * FROM records WHERE key = @key FOR UPDATE;

-- name: RecordSetStatus :one
UPDATE records
SET status = @status, undo_id = coalesce(sqlc.narg(undo_id), undo_id),
    refunded_cents = coalesce(sqlc.narg(refunded_cents), refunded_cents), updated_at = now()
WHERE key = @key
RETURNING *;

-- name: RecordList :many
-- Pages through records oldest first: seq greater than after_seq, optional
-- status and trip_id filters.
SELECT * FROM records
WHERE seq > @after_seq
  AND (sqlc.narg(status)::text IS NULL OR status = sqlc.narg(status)::text)
  AND (sqlc.narg(trip_id)::text IS NULL OR trip_id = sqlc.narg(trip_id)::text)
ORDER BY seq
LIMIT @max_rows;
