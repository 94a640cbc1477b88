-- +goose Up
-- version: the trip version (events.VersionExtension: its saga order,
-- "hotel,insurance,payment,car") the step was recorded under, copied
-- from the event that asked for it; every event the step publishes
-- carries it on, so the services after it react by the trip's own
-- catalogue. '' for a row recorded before versions, or without an event
-- naming one: the default order.
ALTER TABLE steps ADD COLUMN version text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE steps DROP COLUMN version;
