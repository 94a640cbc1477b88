-- +goose Up
-- unattributed: a company record whose trip_id is missing, not a string or
-- not a trip id; trip_id is then "?<company>/<record id>".
ALTER TABLE findings DROP CONSTRAINT findings_kind_check;
ALTER TABLE findings ADD CONSTRAINT findings_kind_check CHECK (kind IN ('half', 'orphan', 'stuck', 'unattributed'));

-- +goose Down
DELETE FROM findings WHERE kind = 'unattributed';
ALTER TABLE findings DROP CONSTRAINT findings_kind_check;
ALTER TABLE findings ADD CONSTRAINT findings_kind_check CHECK (kind IN ('half', 'orphan', 'stuck'));
