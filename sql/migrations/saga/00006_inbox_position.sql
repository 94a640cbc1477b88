-- +goose Up
-- inbox_position: the last ack floor the server reported for each inbox's
-- durable consumer (every message of the stream up to ack_floor is acked,
-- so handled or parked). A consumer found missing is recreated from
-- ack_floor + 1; the inbox table makes any redelivery after it harmless.
CREATE TABLE inbox_position (
    consumer   text        NOT NULL,
    stream     text        NOT NULL,
    ack_floor  bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, stream)
);

-- +goose Down
DROP TABLE inbox_position;
