-- name: TripRequestCancellation :one
-- Moves a confirmed trip to canceling_by_traveler and records the
-- cancellation; no row when the trip is not confirmed (then the caller
-- reads it to say why). The row lock orders two cancellations of one trip.
UPDATE trips
SET status = 'canceling_by_traveler', cancel_key = @cancel_key, cancel_requested_at = @requested_at,
    cancel_band = @band, charged_cents = @charged_cents, fee_cents = @fee_cents,
    refund_cents = @refund_cents, updated_at = now()
WHERE trip_id = @trip_id AND status = 'confirmed'
RETURNING *;

-- name: TripSetCanceledByTraveler :many
-- canceled_at is the database's now(), as every stamp of the trip row.
-- No row when the trip is not canceling_by_traveler.
UPDATE trips SET status = 'canceled_by_traveler', canceled_at = now(), updated_at = now()
WHERE trip_id = @trip_id AND status = 'canceling_by_traveler'
RETURNING canceled_at, updated_at;

-- name: TripGetForUpdate :one
SELECT * FROM trips WHERE trip_id = @trip_id FOR UPDATE;
