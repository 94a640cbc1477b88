-- +goose Up
-- Where each published event was stored, from its PubAck, so the relay's
-- verify (outbox.Verify) can read it back by sequence while the row is
-- kept and publish again what the stream lost (a message deleted, a stream
-- purged or restored from an older snapshot, a server that lost what it had
-- not synced to disk).
ALTER TABLE outbox
    ADD COLUMN stream      text,        -- PubAck.Stream
    ADD COLUMN stream_seq  bigint,      -- PubAck.Sequence
    ADD COLUMN verified_at timestamptz, -- last read back and found at stream_seq
    ADD COLUMN lost_at     timestamptz, -- last found missing from its stream
    ADD COLUMN losses      integer NOT NULL DEFAULT 0;
-- The gap check: the rows of one stream by sequence.
CREATE INDEX outbox_stored ON outbox (stream, stream_seq)
    WHERE published_at IS NOT NULL AND stream_seq IS NOT NULL;
-- The read-back sweep: the rows read back longest ago (never first).
CREATE INDEX outbox_to_verify ON outbox (verified_at NULLS FIRST, id)
    WHERE published_at IS NOT NULL AND stream_seq IS NOT NULL;
-- /readyz: the events found lost lately.
CREATE INDEX outbox_lost ON outbox (lost_at) WHERE lost_at IS NOT NULL;

-- +goose Down
DROP INDEX outbox_lost;
DROP INDEX outbox_to_verify;
DROP INDEX outbox_stored;
ALTER TABLE outbox
    DROP COLUMN stream,
    DROP COLUMN stream_seq,
    DROP COLUMN verified_at,
    DROP COLUMN lost_at,
    DROP COLUMN losses;
