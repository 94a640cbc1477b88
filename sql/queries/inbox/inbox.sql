-- name: InboxInsertIfAbsent :execrows
INSERT INTO inbox (consumer, source, event_id, ce_type, stream, stream_seq)
VALUES (@consumer, @source, @event_id, @ce_type, @stream, @stream_seq)
ON CONFLICT DO NOTHING;

-- name: InboxInsertManyIfAbsent :many
-- The inbox rows of a batch of deliveries of one stream in one statement;
-- returns the events that were not there yet (the others are duplicates).
INSERT INTO inbox (consumer, source, event_id, ce_type, stream, stream_seq)
SELECT @consumer, u.source, u.event_id, u.ce_type, @stream, u.seq
FROM (SELECT unnest(@sources::text[]) AS source,
             unnest(@event_ids::text[]) AS event_id,
             unnest(@ce_types::text[]) AS ce_type,
             unnest(@seqs::bigint[]) AS seq) AS u
ON CONFLICT DO NOTHING
RETURNING source, event_id;

-- name: InboxPositionSet :exec
-- The consumer's ack floor as the server last reported it, with the
-- stream's identity it counts on (see InboxStreamRecord). A row that
-- records another stream (another replica already took up a new one) is
-- left as it is: a floor of the old stream means nothing on the new one.
INSERT INTO inbox_position (consumer, stream, ack_floor, stream_created, first_seq, last_seq)
VALUES (@consumer, @stream, @ack_floor, @stream_created, @first_seq, @last_seq)
ON CONFLICT (consumer, stream) DO UPDATE
SET ack_floor = excluded.ack_floor, stream_created = excluded.stream_created,
    first_seq = excluded.first_seq, last_seq = GREATEST(inbox_position.last_seq, excluded.last_seq),
    updated_at = now()
WHERE inbox_position.stream_created IS NULL OR inbox_position.stream_created = excluded.stream_created;

-- name: InboxStreamGet :one
-- The consumer's position and the stream it counts on (no row: none).
SELECT ack_floor, stream_created, first_seq, last_seq FROM inbox_position
WHERE consumer = @consumer AND stream = @stream;

-- name: InboxPositionEnsure :exec
-- Makes the consumer's row exist (floor 0: nothing known), so that
-- InboxStreamLock has a row to lock.
INSERT INTO inbox_position (consumer, stream, ack_floor)
VALUES (@consumer, @stream, 0)
ON CONFLICT (consumer, stream) DO NOTHING;

-- name: InboxStreamLock :one
-- The consumer's position and the stream it counts on, the row locked
-- until the transaction ends: the replicas of a service decide one after
-- the other whether their stream was replaced.
SELECT ack_floor, stream_created, first_seq, last_seq FROM inbox_position
WHERE consumer = @consumer AND stream = @stream
FOR UPDATE;

-- name: InboxStreamRecord :exec
-- Records the stream the consumer's position counts on: its creation time
-- and the first and last sequences seen. ack_floor is set as given (0 when
-- the stream is another one: nothing of it is known to be handled).
UPDATE inbox_position
SET ack_floor = @ack_floor, stream_created = @stream_created, first_seq = @first_seq, last_seq = @last_seq, updated_at = now()
WHERE consumer = @consumer AND stream = @stream;

-- name: InboxPositionGet :one
-- The stored ack floor of a consumer on a stream, 0 when none is stored.
SELECT COALESCE((SELECT ack_floor FROM inbox_position
                 WHERE consumer = @consumer AND stream = @stream), 0)::bigint;
