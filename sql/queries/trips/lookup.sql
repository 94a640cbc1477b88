-- name: TripFindByEmail :many
-- The newest trips (at most max) whose traveler's email is email, compared
-- without case; a sequential scan, for operators' searches only.
SELECT trip_id FROM trips
WHERE lower(request->'traveler'->>'email') = lower(@email::text)
ORDER BY created_at DESC, trip_id DESC
LIMIT @max;
