-- +goose Up
-- One company simulator's records. The same set is applied to each
-- company's schema (sim_hotel, sim_payments, sim_cars, sim_mail), so table
-- names are unqualified and generic: a company has one kind of record.

-- idempotency: the first answer given to each Idempotency-Key. The row is
-- inserted at the start of the transaction that performs the operation, so a
-- concurrent request with the same key waits on the unique index and then
-- replays the stored answer. Sold-out answers live only here (no record).
CREATE TABLE idempotency (
    key         text        PRIMARY KEY,
    op          text        NOT NULL,              -- hold | charge | book | message
    fingerprint text        NOT NULL,              -- sha256 of the canonical request body, hex
    request     jsonb       NOT NULL,              -- the canonical request body
    status_code integer     NOT NULL DEFAULT 0,    -- HTTP status of the first answer
    response    bytea,                             -- body of the first answer, byte for byte
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- records: the company's own records (holds, charges, bookings, messages),
-- paged by seq for reconciliation.
CREATE TABLE records (
    seq        bigserial   PRIMARY KEY,
    key        text        NOT NULL UNIQUE,        -- the Idempotency-Key that created it
    id         text        NOT NULL UNIQUE,        -- the company's id, e.g. H-1f2e...
    trip_id    text        NOT NULL,
    status     text        NOT NULL,               -- held/released, charged/refunded/declined, booked/canceled, queued
    request    jsonb       NOT NULL,               -- the canonical request body
    reason     text,                               -- why it was declined
    undo_id    text,                               -- refund_id of a refunded charge
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX records_status ON records (status, seq);
CREATE INDEX records_trip ON records (trip_id, seq);

-- statement_lines: the card processor's statements. A refund is a second
-- line; a charge line is never deleted.
CREATE TABLE statement_lines (
    seq          bigserial   PRIMARY KEY,
    card_token   text        NOT NULL,
    charge_key   text        NOT NULL,
    trip_id      text        NOT NULL,
    amount_cents bigint      NOT NULL,             -- always positive; kind gives the direction
    currency     text        NOT NULL,
    kind         text        NOT NULL CHECK (kind IN ('charge', 'refund')),
    at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (charge_key, kind)
);
CREATE INDEX statement_lines_card ON statement_lines (card_token, seq);

-- +goose Down
DROP TABLE statement_lines;
DROP TABLE records;
DROP TABLE idempotency;
