-- +goose Up
-- canceling_since: when the trip's status became canceling, on the
-- database's clock (saga/clock.go: every deadline is the database's). The
-- delay notice's pass (services/trips/notice.go) mails the traveler of a
-- trip still canceling CANCELING_NOTICE_AFTER_MS after it. A trip
-- canceling before this migration counts from its last change.
ALTER TABLE trips ADD COLUMN canceling_since timestamptz;
UPDATE trips SET canceling_since = updated_at WHERE status = 'canceling';
CREATE INDEX trips_canceling_since ON trips (canceling_since) WHERE status = 'canceling';

-- +goose Down
DROP INDEX trips_canceling_since;
ALTER TABLE trips DROP COLUMN canceling_since;
