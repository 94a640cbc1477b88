-- +goose Up
-- status_since: when the step's row last changed status, by the database's
-- clock (a trigger, so every transition the runner, the operator's actions
-- or the recovery pass make is stamped without each having to). The
-- gauges tripsaga_steps_oldest_open_age_seconds{state="unknown"|
-- "compensating"} and their alerts read it: how long an outcome has been
-- unknown, how long an undo has been open.
ALTER TABLE steps ADD COLUMN status_since timestamptz;
UPDATE steps SET status_since = updated_at;
ALTER TABLE steps ALTER COLUMN status_since SET DEFAULT now(), ALTER COLUMN status_since SET NOT NULL;

-- +goose StatementBegin
CREATE FUNCTION steps_stamp_status_since() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
        NEW.status_since := now();
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER steps_status_since BEFORE INSERT OR UPDATE OF status ON steps
    FOR EACH ROW EXECUTE FUNCTION steps_stamp_status_since();
CREATE INDEX steps_open_since ON steps (status, status_since)
    WHERE status IN ('unknown', 'compensating');

-- +goose Down
DROP TRIGGER steps_status_since ON steps;
DROP FUNCTION steps_stamp_status_since();
ALTER TABLE steps DROP COLUMN status_since;
