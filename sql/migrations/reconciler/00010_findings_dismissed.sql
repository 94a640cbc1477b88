-- +goose Up
-- A finding an operator dismissed (the dismiss action, with why): it stays
-- open while what it names holds, so the sweep does not raise it again,
-- but it no longer counts as open (figures, gauges, the dashboard); it is
-- resolved as any other once the sweep no longer finds it.
ALTER TABLE findings ADD COLUMN dismissed_at timestamptz;
ALTER TABLE findings ADD COLUMN dismissed_by text;
ALTER TABLE findings ADD COLUMN dismiss_reason text;

-- +goose Down
ALTER TABLE findings DROP COLUMN dismiss_reason;
ALTER TABLE findings DROP COLUMN dismissed_by;
ALTER TABLE findings DROP COLUMN dismissed_at;
