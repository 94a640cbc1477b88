-- +goose Up
-- open_undo: a trip not settled whose undo of a step raised its incident
-- (its stuck event, e.g. payment.refund_stuck, seen without the undo's own
-- event) while the steps before it were undone: one named open undo, not
-- a half trip.
ALTER TABLE findings DROP CONSTRAINT findings_kind_check;
ALTER TABLE findings ADD CONSTRAINT findings_kind_check CHECK (kind IN ('half', 'orphan', 'stuck', 'unattributed', 'open_undo'));

-- +goose Down
DELETE FROM findings WHERE kind = 'open_undo';
ALTER TABLE findings DROP CONSTRAINT findings_kind_check;
ALTER TABLE findings ADD CONSTRAINT findings_kind_check CHECK (kind IN ('half', 'orphan', 'stuck', 'unattributed'));
