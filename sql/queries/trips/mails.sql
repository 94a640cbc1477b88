-- name: TripNoticeDue :many
-- The trips still canceling for at least after_ms on the database's clock
-- (canceling_since) whose traveler has no delay notice recorded yet (no
-- step notice_mail in the step log), oldest first, at most max, locked
-- (SKIP LOCKED: replicas' passes take different trips, and the step log's
-- primary key makes one notice per trip whatever they do).
SELECT t.* FROM trips t
WHERE t.status = 'canceling'
  AND t.canceling_since <= now() - make_interval(secs => sqlc.arg(after_ms)::float8 / 1000)
  AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.trip_id = t.trip_id AND s.step = 'notice_mail')
ORDER BY t.canceling_since
LIMIT @max
FOR UPDATE OF t SKIP LOCKED;

-- name: TripMailKeys :many
-- The Idempotency-Keys of the trip's mail steps recorded so far (any
-- status), to tell whether the traveler was told it was confirmed.
SELECT idempotency_key FROM steps
WHERE trip_id = @trip_id AND step IN ('mail', 'traveler_mail', 'notice_mail', 'correction_mail');
