-- +goose Up
-- The stream an inbox_position's ack floor counts on. A stream deleted and
-- made again, or restored from an older store, numbers its messages anew:
-- an ack floor of the old one means nothing on it. stream_created is the
-- stream's creation time (JetStream StreamInfo.Created, the same on every
-- replica of a clustered stream and kept by a restart or a restore);
-- first_seq and last_seq are the stream's first and last sequences as the
-- inbox last saw them (last_seq only grows on one stream: a stream whose
-- last sequence is below it was restored from an older store). A row with
-- no stream_created (written before this migration) takes the stream it
-- next sees as its own.
ALTER TABLE inbox_position
    ADD COLUMN stream_created timestamptz,
    ADD COLUMN first_seq bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_seq  bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE inbox_position DROP COLUMN stream_created, DROP COLUMN first_seq, DROP COLUMN last_seq;
