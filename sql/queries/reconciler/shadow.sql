-- name: ShadowDeleteAll :exec
DELETE FROM trip_view_shadow;

-- name: ShadowInsertMany :exec
-- settled "" stands for NULL; seen is the kinds joined by ','.
INSERT INTO trip_view_shadow (trip_id, seen, status, settled, events, first_event_at, last_event_at)
SELECT u.trip_id, string_to_array(u.seen, ','), u.status, NULLIF(u.settled, ''), u.n, u.first_at, u.last_at
FROM (SELECT unnest(@trip_ids::text[]) AS trip_id,
             unnest(@seens::text[]) AS seen,
             unnest(@statuses::text[]) AS status,
             unnest(@settled::text[]) AS settled,
             unnest(@counts::int[]) AS n,
             unnest(@first_ats::timestamptz[]) AS first_at,
             unnest(@last_ats::timestamptz[]) AS last_at) AS u;

-- name: ShadowDiff :many
-- Where the live view and the shadow differ, trip by trip ('' for a trip
-- one of them lacks).
SELECT coalesce(l.trip_id, s.trip_id)::text AS trip_id,
       coalesce(array_to_string(l.seen, ','), '')::text AS live_seen, coalesce(array_to_string(s.seen, ','), '')::text AS shadow_seen,
       coalesce(l.status, '')::text AS live_status, coalesce(s.status, '')::text AS shadow_status,
       coalesce(l.events, -1)::int AS live_events, coalesce(s.events, -1)::int AS shadow_events,
       (l.trip_id IS NOT NULL AND s.trip_id IS NOT NULL
        AND (l.first_event_at <> s.first_event_at OR l.last_event_at <> s.last_event_at))::bool AS times_differ
FROM trip_view l FULL JOIN trip_view_shadow s ON s.trip_id = l.trip_id
WHERE l.trip_id IS NULL OR s.trip_id IS NULL
   OR l.seen IS DISTINCT FROM s.seen OR l.status <> s.status OR l.settled IS DISTINCT FROM s.settled
   OR l.events <> s.events OR l.first_event_at <> s.first_event_at OR l.last_event_at <> s.last_event_at
ORDER BY 1;

-- name: ShadowCount :one
SELECT count(*) FROM trip_view_shadow;
