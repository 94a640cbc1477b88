-- name: OutboxInsert :exec
INSERT INTO outbox (event_id, nats_subject, headers, data)
VALUES (@event_id, @nats_subject, @headers, @data);

-- name: OutboxNotify :exec
SELECT pg_notify('outbox_' || current_schema(), '');

-- name: OutboxClaimBatch :many
-- Rows are claimed by status, not by an id watermark, so a row whose
-- transaction commits late is never skipped; SKIP LOCKED lets several
-- relays run at once.
SELECT id, event_id, nats_subject, headers, data, attempts
FROM outbox
WHERE published_at IS NULL AND quarantined_at IS NULL AND next_attempt_at <= now()
ORDER BY id
LIMIT @max
FOR UPDATE SKIP LOCKED;

-- name: OutboxMarkPublished :exec
UPDATE outbox SET published_at = now(), last_error = NULL
WHERE id = ANY(@ids::bigint[]);

-- name: OutboxMarkFailed :one
UPDATE outbox
SET attempts = attempts + 1,
    last_error = @last_error,
    next_attempt_at = now() + make_interval(secs => @backoff_seconds::float8),
    quarantined_at = CASE WHEN attempts + 1 >= @max_attempts::int THEN now() END
WHERE id = @id
RETURNING (quarantined_at IS NOT NULL)::bool AS quarantined;

-- name: OutboxCountPending :one
SELECT count(*) FROM outbox WHERE published_at IS NULL AND quarantined_at IS NULL;

-- name: OutboxCountQuarantined :one
SELECT count(*) FROM outbox WHERE quarantined_at IS NOT NULL;

-- name: OutboxDeletePublishedBefore :execrows
DELETE FROM outbox WHERE published_at < @before::timestamptz;

-- name: OutboxCurrentSchema :one
SELECT current_schema()::text;

-- name: InboxInsertIfAbsent :execrows
INSERT INTO inbox (consumer, source, event_id, ce_type, stream, stream_seq)
VALUES (@consumer, @source, @event_id, @ce_type, @stream, @stream_seq)
ON CONFLICT DO NOTHING;
