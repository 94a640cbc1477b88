-- +goose Up
-- refunded_cents: how much of a refunded charge was refunded (the card
-- processor; providers.md, "Partial refunds"). NULL on every other record
-- and on charges refunded before partial refunds existed (refunded whole).
ALTER TABLE records ADD COLUMN refunded_cents bigint;

-- +goose Down
ALTER TABLE records DROP COLUMN refunded_cents;
