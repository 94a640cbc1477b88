-- +goose Up
-- view_rebuild: the rebuild (replay) of a projection under way or left
-- half-way. Its row is written with finished_at NULL in the transaction
-- that clears the view, and finished_at set when the replay has applied
-- every event: a replay killed between the two (SIGKILL, a lost
-- connection) leaves the row unfinished, so the sweep judges no half-built
-- view (no false orphan findings), the dashboard says the view is being
-- rebuilt, and the reconciler runs the replay again until it finishes.
CREATE TABLE view_rebuild (
  projection  text PRIMARY KEY,
  started_at  timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz
);

-- +goose Down
DROP TABLE view_rebuild;
