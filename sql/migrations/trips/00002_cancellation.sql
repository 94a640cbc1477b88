-- +goose Up
-- The traveler's cancellation of a confirmed trip (trips-api.md,
-- POST /trips/{id}/cancellation): the request's key, when it came, the fee
-- band that applied and the amounts in minor units (fee_cents +
-- refund_cents = charged_cents), and when the cancellation was done. The
-- trip keeps its booking history (seen, settled_at) beside it.
ALTER TABLE trips
    ADD COLUMN cancel_key          text,
    ADD COLUMN cancel_requested_at timestamptz,
    ADD COLUMN cancel_band         text,
    ADD COLUMN charged_cents       bigint,
    ADD COLUMN fee_cents           bigint,
    ADD COLUMN refund_cents        bigint,
    ADD COLUMN canceled_at         timestamptz;

-- +goose Down
ALTER TABLE trips
    DROP COLUMN cancel_key, DROP COLUMN cancel_requested_at, DROP COLUMN cancel_band,
    DROP COLUMN charged_cents, DROP COLUMN fee_cents, DROP COLUMN refund_cents, DROP COLUMN canceled_at;
