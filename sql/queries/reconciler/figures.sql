-- name: TripViewUnfinished :one
-- Trips not settled by a trip.confirmed or trip.canceled event, and the
-- oldest one (by its first event; "" and 0 when none).
SELECT count(*)::bigint AS trips,
       coalesce((array_agg(trip_id ORDER BY first_event_at, trip_id))[1], '')::text AS oldest_trip,
       coalesce(extract(epoch FROM now() - min(first_event_at)), 0)::float8 AS oldest_age_seconds
FROM trip_view WHERE settled IS NULL;

-- name: FindingHalfPerDay :many
-- Half trips the sweep found, by the UTC day it first saw them, since
-- since.
SELECT date_trunc('day', first_seen AT TIME ZONE 'UTC')::text AS day, count(*)::bigint AS trips
FROM findings WHERE kind = 'half' AND first_seen >= @since::timestamptz
GROUP BY 1 ORDER BY 1;
