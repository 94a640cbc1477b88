-- +goose Up
-- refund_cents: what a traveler's cancellation refunds (charge minus fee,
-- minor units), from trip.cancellation_requested; NULL for every other
-- trip. The sweep checks the card processor's refunded_cents against it.
ALTER TABLE trip_view ADD COLUMN refund_cents bigint;

-- +goose Down
ALTER TABLE trip_view DROP COLUMN refund_cents;
