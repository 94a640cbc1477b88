-- +goose Up
-- version: the trip version (events.VersionExtension), the saga order the
-- trip started under ("hotel,insurance,payment,car"), stamped on its
-- trip.requested from the trips service's STEPS at creation: its status
-- is projected by that catalogue for its whole life, whatever STEPS the
-- service runs later. '' for a trip of before versions: the default order.
ALTER TABLE trips ADD COLUMN version text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE trips DROP COLUMN version;
