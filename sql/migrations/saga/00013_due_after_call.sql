-- +goose Up
-- due_after_call: an operator asked for the row to be retried now (retry_undo,
-- resume) while a call of it was in flight (its lease live and owned). The
-- lease is left as it is, so no second call of the key starts; the owner,
-- when it writes that call's answer, makes the row due at once instead of
-- after its backoff, and clears the flag.
ALTER TABLE steps ADD COLUMN due_after_call boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE steps DROP COLUMN due_after_call;
