-- +goose Up
-- processes: the processes (replicas) of this service that work its step
-- log, for the liveness of step leases. A live process holds a
-- session-level advisory lock (pg_advisory_lock(namespace, id), the
-- namespace derived from the schema's name) on a connection of its own for
-- its whole life, and beats seen_at every second. PostgreSQL releases the
-- lock the moment the process's session ends, so a process killed with
-- SIGKILL is known dead at once; a process whose lock is not held and
-- whose beat is older than the grace, or that is marked gone (it stopped,
-- or a successor of the same instance name started), is dead too.
CREATE TABLE processes (
    id         integer     GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    instance   text        NOT NULL,   -- TRIPSAGA_INSTANCE, or host:service
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now(),
    gone_at    timestamptz
);
CREATE INDEX processes_instance ON processes (instance) WHERE gone_at IS NULL;

-- owner: the process whose lease a started, compensating or verifying row
-- holds (NULL when no call is in flight). Another process takes the row
-- before its lease ends only when its owner is dead.
ALTER TABLE steps ADD COLUMN owner integer;
CREATE INDEX steps_owned ON steps (owner) WHERE owner IS NOT NULL;

-- +goose Down
DROP INDEX steps_owned;
ALTER TABLE steps DROP COLUMN owner;
DROP TABLE processes;
