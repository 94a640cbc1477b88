-- +goose Up
-- version: the trip's version (events.VersionExtension: the saga order it
-- started under, "hotel,insurance,payment,car"), from the first of its
-- events that carries one; '' until then, and for a trip of before
-- versions (the default order). The half rule and the status follow the
-- trip's own steps: a trip started without insurance must have no policy,
-- one with it its policy bought (confirmed) or canceled (canceled).
ALTER TABLE trip_view ADD COLUMN version text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE trip_view DROP COLUMN version;
