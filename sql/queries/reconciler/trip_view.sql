-- name: TripViewApply :one
-- Adds one event to its trip: inserts the row (with the status computed
-- for the new trip) or merges the kind into seen. The row stays locked
-- until the transaction ends, so events of one trip apply one at a time.
INSERT INTO trip_view AS v (trip_id, seen, status, settled, requested, mailed, events, first_event_at, last_event_at, version)
VALUES (@trip_id, ARRAY[@kind::text], @new_status, sqlc.narg(new_settled)::text,
        @kind::text = 'trip.requested', @kind::text = 'mail.sent', 1, @at, @at, @version::text)
ON CONFLICT (trip_id) DO UPDATE
SET seen = ARRAY(SELECT DISTINCT k FROM unnest(v.seen || EXCLUDED.seen) AS k ORDER BY k),
    version = CASE WHEN v.version = '' THEN EXCLUDED.version ELSE v.version END,
    requested = v.requested OR EXCLUDED.requested,
    mailed = v.mailed OR EXCLUDED.mailed,
    events = v.events + 1,
    first_event_at = LEAST(v.first_event_at, EXCLUDED.first_event_at),
    last_event_at = GREATEST(v.last_event_at, EXCLUDED.last_event_at),
    updated_at = now()
RETURNING seen, status, settled, version;

-- name: TripViewSetStatus :exec
UPDATE trip_view SET status = @status, settled = sqlc.narg(settled)::text, updated_at = now()
WHERE trip_id = @trip_id;

-- name: TripViewGet :one
SELECT * FROM trip_view WHERE trip_id = @trip_id;

-- name: TripViewListNewest :many
SELECT * FROM trip_view ORDER BY first_event_at DESC, trip_id DESC LIMIT @max;

-- name: TripViewListAll :many
-- Every trip, in trip id order (the sweep and replay comparisons).
SELECT * FROM trip_view ORDER BY trip_id;

-- name: TripViewListRequested :many
-- The trips whose trip.requested was seen, among ids.
SELECT trip_id FROM trip_view WHERE trip_id = ANY(@trip_ids::text[]) AND requested;

-- name: TripViewCountByStatus :many
SELECT status, count(*) AS trips FROM trip_view GROUP BY status ORDER BY status;

-- name: TripViewCount :one
SELECT count(*) FROM trip_view;

-- name: TripViewDeleteAll :execrows
DELETE FROM trip_view;

-- name: ProjectionLockShared :exec
-- Taken by every live projection transaction; the replay's clearing
-- transaction takes it exclusively, so no live transaction straddles it.
SELECT pg_advisory_xact_lock_shared(hashtext(current_schema() || '/reconciler/projection'));

-- name: ProjectionLockExclusive :exec
SELECT pg_advisory_xact_lock(hashtext(current_schema() || '/reconciler/projection'));

-- name: ReplayLock :exec
-- Session lock held by a replay from start to end: one replay at a time,
-- and no sweep while the view is being rebuilt.
SELECT pg_advisory_lock(hashtext(current_schema() || '/reconciler/replay'));

-- name: ReplayUnlock :exec
SELECT pg_advisory_unlock(hashtext(current_schema() || '/reconciler/replay'));

-- name: SweepTryLockShared :one
SELECT pg_try_advisory_xact_lock_shared(hashtext(current_schema() || '/reconciler/replay'))::bool AS locked;

-- name: SweepTryLockLeader :one
-- One sweep at a time across the reconciler's replicas: the sweep's
-- transaction holds this lock; a replica that cannot take it skips its
-- sweep (the other's findings are the same table).
SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '/reconciler/sweep'))::bool AS locked;

-- name: InboxDeleteByConsumer :execrows
DELETE FROM inbox WHERE consumer = @consumer;

-- name: TripViewSetStatusMany :exec
-- settled "" stands for NULL.
UPDATE trip_view AS v
SET status = u.status, settled = NULLIF(u.settled, ''), updated_at = now()
FROM (SELECT unnest(@trip_ids::text[]) AS trip_id, unnest(@statuses::text[]) AS status,
             unnest(@settled::text[]) AS settled) AS u
WHERE v.trip_id = u.trip_id;

-- name: ProjectionInboxInsertMany :many
-- The inbox rows of a batch of events (of any streams) in one statement;
-- returns the ids of the events the inbox did not have yet.
INSERT INTO inbox (consumer, source, event_id, ce_type, stream, stream_seq)
SELECT @consumer, u.source, u.event_id, u.ce_type, u.stream, u.seq
FROM (SELECT unnest(@sources::text[]) AS source,
             unnest(@event_ids::text[]) AS event_id,
             unnest(@ce_types::text[]) AS ce_type,
             unnest(@streams::text[]) AS stream,
             unnest(@seqs::bigint[]) AS seq) AS u
ON CONFLICT DO NOTHING
RETURNING source, event_id;

-- name: TripViewApplyMany :many
-- Merges a batch's new events into trip_view, one row per trip (the
-- caller groups them: kinds is the trip's kinds joined by ',', status and
-- settled what they make for a new trip, settled "" for NULL), in one
-- statement, in trip id order; returns each trip's merged row for the
-- status check.
INSERT INTO trip_view AS v (trip_id, seen, status, settled, requested, mailed, events, first_event_at, last_event_at, version)
SELECT u.trip_id, string_to_array(u.kinds, ','), u.status, NULLIF(u.settled, ''),
       'trip.requested' = ANY(string_to_array(u.kinds, ',')), 'mail.sent' = ANY(string_to_array(u.kinds, ',')),
       u.n, u.first_at, u.last_at, u.version
FROM (SELECT unnest(@trip_ids::text[]) AS trip_id,
             unnest(@versions::text[]) AS version,
             unnest(@kinds::text[]) AS kinds,
             unnest(@statuses::text[]) AS status,
             unnest(@settled::text[]) AS settled,
             unnest(@counts::int[]) AS n,
             unnest(@first_ats::timestamptz[]) AS first_at,
             unnest(@last_ats::timestamptz[]) AS last_at) AS u
ORDER BY u.trip_id
ON CONFLICT (trip_id) DO UPDATE
SET seen = ARRAY(SELECT DISTINCT k FROM unnest(v.seen || EXCLUDED.seen) AS k ORDER BY k),
    version = CASE WHEN v.version = '' THEN EXCLUDED.version ELSE v.version END,
    requested = v.requested OR EXCLUDED.requested,
    mailed = v.mailed OR EXCLUDED.mailed,
    events = v.events + EXCLUDED.events,
    first_event_at = LEAST(v.first_event_at, EXCLUDED.first_event_at),
    last_event_at = GREATEST(v.last_event_at, EXCLUDED.last_event_at),
    updated_at = now()
RETURNING trip_id, seen, status, settled, version;

-- name: TripViewSetRefund :exec
-- Records what a traveler's cancellation of the trip refunds (from its
-- trip.cancellation_requested), for the sweep.
UPDATE trip_view SET refund_cents = @refund_cents::bigint, updated_at = now()
WHERE trip_id = @trip_id;

-- name: RebuildBegin :exec
-- In the clearing transaction: the projection's rebuild is under way.
INSERT INTO view_rebuild (projection, started_at, finished_at) VALUES (@projection, now(), NULL)
ON CONFLICT (projection) DO UPDATE SET started_at = now(), finished_at = NULL;

-- name: RebuildFinish :exec
UPDATE view_rebuild SET finished_at = now() WHERE projection = @projection;

-- name: RebuildUnfinished :many
-- The start of the projection's rebuild if it has not finished (no row,
-- or a finished one, when none is under way or left half-way).
SELECT started_at FROM view_rebuild WHERE projection = @projection AND finished_at IS NULL;
