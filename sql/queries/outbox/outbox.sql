-- name: OutboxInsert :exec
-- delay_seconds > 0 keeps the row out of the relays' claims for that long:
-- the writer's own relay publishes it right after commit (outbox.Write).
INSERT INTO outbox (event_id, nats_subject, headers, data, next_attempt_at)
VALUES (@event_id, @nats_subject, @headers, @data, now() + make_interval(secs => @delay_seconds::float8));

-- name: OutboxMarkPublishedByEventID :exec
-- Marks rows the writer's own relay published right after commit, with
-- the stream and sequence of each one's PubAck. published_at is the
-- time of the statement (after the PubAck, so after the server stored it), not
-- the time of the transaction: the verify counts the duplicate window from it.
UPDATE outbox o
SET published_at = clock_timestamp(), last_error = NULL, stream = u.stream, stream_seq = u.seq, verified_at = NULL
FROM (SELECT unnest(@event_ids::text[]) AS event_id,
             unnest(@streams::text[]) AS stream,
             unnest(@seqs::bigint[]) AS seq) AS u
WHERE o.event_id = u.event_id AND o.published_at IS NULL;

-- name: OutboxNotify :exec
SELECT pg_notify('outbox_' || current_schema(), '');

-- name: OutboxClaimBatch :many
-- Rows are claimed by status, not by an id watermark, so a row whose
-- transaction commits late is never skipped; SKIP LOCKED lets several
-- relays run at once.
SELECT id, event_id, nats_subject, headers, data, attempts
FROM outbox
-- Ordered as the partial index outbox_unpublished is, so a batch reads
-- LIMIT rows off the index instead of sorting every due row (a backlog of
-- 100,000 rows was sorted for each batch of 200).
WHERE published_at IS NULL AND quarantined_at IS NULL AND next_attempt_at <= now()
ORDER BY next_attempt_at, id
LIMIT @max
FOR UPDATE SKIP LOCKED;

-- name: OutboxMarkPublished :exec
-- With the stream and sequence of the PubAck of each row; published_at is the
-- time of the statement, after every PubAck (the transaction of the batch began
-- before its publishes).
UPDATE outbox o
SET published_at = clock_timestamp(), last_error = NULL, stream = u.stream, stream_seq = u.seq, verified_at = NULL
FROM (SELECT unnest(@ids::bigint[]) AS id,
             unnest(@streams::text[]) AS stream,
             unnest(@seqs::bigint[]) AS seq) AS u
WHERE o.id = u.id;

-- name: OutboxMarkRefused :one
-- The server refused this event itself: counts towards quarantine.
UPDATE outbox
SET attempts = attempts + 1,
    last_cause = 'refused',
    last_error = @last_error,
    last_failed_at = now(),
    next_attempt_at = now() + make_interval(secs => @backoff_seconds::float8),
    quarantined_at = CASE WHEN attempts + 1 >= @max_attempts::int THEN now() END
WHERE id = @id
RETURNING (quarantined_at IS NOT NULL)::bool AS quarantined;

-- name: OutboxMarkOutage :exec
-- The server could not take these events for a reason of its own (an
-- outage): each row waits min(backoff_min * 2^outages, backoff_max) and its
-- attempts towards quarantine are left as they are.
UPDATE outbox o
SET outages = o.outages + 1,
    last_cause = u.cause,
    last_error = u.err,
    last_failed_at = now(),
    next_attempt_at = now() + interval '1 second' * least(
        sqlc.arg(backoff_min_seconds)::float8 * power(2, least(o.outages, 30)),
        sqlc.arg(backoff_max_seconds)::float8)
FROM (SELECT unnest(@ids::bigint[]) AS id,
             unnest(@causes::text[]) AS cause,
             unnest(@errors::text[]) AS err) AS u
WHERE o.id = u.id;

-- name: OutboxWaiting :many
-- Unpublished, unquarantined rows whose last attempt failed, by cause.
SELECT last_cause::text AS cause, count(*) AS events,
       min(last_failed_at)::timestamptz AS oldest_failure,
       (array_agg(last_error ORDER BY last_failed_at DESC))[1]::text AS last_error
FROM outbox
WHERE published_at IS NULL AND quarantined_at IS NULL AND last_cause IS NOT NULL
GROUP BY last_cause
ORDER BY last_cause;

-- name: OutboxList :many
-- Rows for a person: quarantined ones, and (with include_waiting) unpublished
-- ones whose last attempt failed.
SELECT id, event_id, nats_subject, created_at, attempts, outages,
       last_cause, last_error, last_failed_at, quarantined_at, redriven_at
FROM outbox
WHERE published_at IS NULL
  AND (quarantined_at IS NOT NULL
       OR (@include_waiting::bool AND last_cause IS NOT NULL))
ORDER BY next_attempt_at, id
LIMIT @max;

-- name: OutboxRedrive :many
-- Puts quarantined rows (all of them, or those whose event_id is listed)
-- back in line: the relay publishes each once more.
UPDATE outbox
SET quarantined_at = NULL, attempts = 0, outages = 0,
    next_attempt_at = now(), redriven_at = now()
WHERE quarantined_at IS NOT NULL AND published_at IS NULL
  AND (@every::bool OR event_id = ANY(@event_ids::text[]))
RETURNING event_id;

-- name: OutboxNextDue :one
-- When the soonest unpublished row is due, for an idle relay's sleep; an
-- hour from now when none is.
SELECT coalesce(min(next_attempt_at), now() + interval '1 hour')::timestamptz AS next_due
FROM outbox WHERE published_at IS NULL AND quarantined_at IS NULL;

-- name: OutboxCountPending :one
SELECT count(*) FROM outbox WHERE published_at IS NULL AND quarantined_at IS NULL;

-- name: OutboxCountQuarantined :one
SELECT count(*) FROM outbox WHERE quarantined_at IS NOT NULL;

-- name: OutboxDeletePublishedBefore :execrows
DELETE FROM outbox WHERE published_at < @before::timestamptz;

-- name: OutboxCurrentSchema :one
SELECT current_schema()::text;

-- name: OutboxStoredStreams :many
-- The streams published rows were stored in (a skip scan of outbox_stored).
WITH RECURSIVE s AS (
    (SELECT stream FROM outbox
     WHERE published_at IS NOT NULL AND stream_seq IS NOT NULL
     ORDER BY stream LIMIT 1)
    UNION ALL
    SELECT (SELECT o.stream FROM outbox o
            WHERE o.published_at IS NOT NULL AND o.stream_seq IS NOT NULL AND o.stream > s.stream
            ORDER BY o.stream LIMIT 1)
    FROM s WHERE s.stream IS NOT NULL
)
SELECT stream::text FROM s WHERE stream IS NOT NULL;

-- name: OutboxOutsideStream :many
-- Published rows of a stream published since @since whose sequence the
-- stream no longer holds: below its first, above its last, or deleted.
SELECT id, event_id, stream_seq::bigint AS stream_seq, published_at::timestamptz AS published_at
FROM outbox
WHERE published_at IS NOT NULL AND stream_seq IS NOT NULL AND stream = @stream
  AND published_at >= @since::timestamptz
  AND (stream_seq < @first_seq::bigint OR stream_seq > @last_seq::bigint
       OR stream_seq = ANY(@deleted::bigint[]))
ORDER BY stream_seq
LIMIT @max;

-- name: OutboxToVerify :many
-- Published rows to read back: never read back first, then those read
-- back longest ago (before @before), published since @since.
SELECT id, event_id, stream::text AS stream, stream_seq::bigint AS stream_seq, published_at::timestamptz AS published_at
FROM outbox
WHERE published_at IS NOT NULL AND stream_seq IS NOT NULL
  AND published_at >= @since::timestamptz
  AND (verified_at IS NULL OR verified_at < @before::timestamptz)
ORDER BY verified_at NULLS FIRST, id
LIMIT @max;

-- name: OutboxVerified :exec
-- Marks the rows read back at these sequences and found there; a row
-- published again since (lost, then re-published at another sequence) is
-- left for the next read-back.
UPDATE outbox o SET verified_at = now()
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@seqs::bigint[]) AS seq) u
WHERE o.id = u.id AND o.stream_seq = u.seq AND o.published_at IS NOT NULL;

-- name: OutboxMarkLost :one
-- The stream no longer holds this published row's event: the row is put
-- back in line, to be published again with its event id as Nats-Msg-Id
-- once the stream's duplicate window (counted from the first store, which
-- was before published_at) can no longer take it for a duplicate of the
-- lost copy (plus a margin: the server forgets ids on a timer). Only when it is still as the caller found it (another relay's
-- verify may have been first). Returns when it is due.
UPDATE outbox
SET published_at = NULL, stream = NULL, stream_seq = NULL, verified_at = NULL,
    lost_at = now(), losses = losses + 1,
    last_cause = 'lost', last_error = @why, last_failed_at = now(),
    next_attempt_at = greatest(now(), published_at + make_interval(secs => @duplicate_window_seconds::float8) + make_interval(secs => @margin_seconds::float8))
WHERE id = @id AND published_at IS NOT NULL AND stream_seq = @stream_seq
RETURNING next_attempt_at;

-- name: OutboxLostRecently :one
-- Events found lost since @since: how many, how many of them are not
-- published again yet, and the newest one's event id.
SELECT count(*) AS lost,
       count(*) FILTER (WHERE published_at IS NULL) AS waiting,
       coalesce((array_agg(event_id ORDER BY lost_at DESC))[1], '')::text AS newest
FROM outbox WHERE lost_at >= @since::timestamptz;
