-- name: ProcessRegister :one
-- Registers a process (a replica) of this service; its id keys its
-- advisory lock and the leases it takes.
INSERT INTO processes (instance, host, pid) VALUES (@instance, @host, @pid)
RETURNING id;

-- name: ProcessLock :one
-- Takes the process's session-level advisory lock (two int4 keys, so
-- pg_locks shows them as classid, objid with objsubid 2: PostgreSQL docs,
-- "Advisory Locks" and "pg_locks"). false when it is held elsewhere.
SELECT pg_try_advisory_lock(@namespace::int, @id::int) AS locked;

-- name: ProcessLiveIDs :many
-- The processes whose advisory lock is held now, in this database.
SELECT objid::bigint::int AS id FROM pg_catalog.pg_locks
WHERE locktype = 'advisory' AND objsubid = 2 AND granted
  AND classid::bigint = @namespace::bigint
  AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database());

-- name: ProcessMarkPredecessorsGone :execrows
-- At start: earlier processes of the same instance name whose lock is not
-- held are gone (this process replaces them), so their leases are taken
-- at once rather than after the grace.
UPDATE processes SET gone_at = now()
WHERE instance = @instance AND id <> @id AND gone_at IS NULL
  AND id <> ALL (@live::int[]);

-- name: ProcessBeat :execrows
-- The process is alive (and not gone: a beat after a wrongful gone mark
-- takes it back).
UPDATE processes SET seen_at = now(), gone_at = NULL WHERE id = @id;

-- name: ProcessGone :exec
UPDATE processes SET gone_at = now() WHERE id = @id;

-- name: ProcessDeleteOld :execrows
-- Forgets processes gone or silent for a day that own no lease.
DELETE FROM processes p
WHERE coalesce(p.gone_at, p.seen_at) < now() - interval '1 day'
  AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.owner = p.id);

-- name: ProcessList :many
SELECT * FROM processes ORDER BY id;

-- name: StepReleaseDeadLeases :many
-- Ends now the leases held by dead processes: rows whose owner's lock is
-- not held (live lists those held) and whose owner is gone, unknown, or
-- silent for longer than grace_ms. The claim then takes them like any due
-- row. Never the caller's own rows; a row locked by its writer is left for
-- the next pass.
WITH dead AS (
    SELECT s.trip_id, s.step, s.owner FROM steps s
    WHERE s.owner IS NOT NULL AND s.owner <> @me::int
      AND s.owner <> ALL (@live::int[])
      AND NOT EXISTS (SELECT 1 FROM processes p
                      WHERE p.id = s.owner AND p.gone_at IS NULL
                        AND p.seen_at > now() - make_interval(secs => sqlc.arg(grace_ms)::float8 / 1000))
    FOR UPDATE OF s SKIP LOCKED
)
UPDATE steps s SET
    next_attempt_at = CASE WHEN s.next_attempt_at > now() THEN now() ELSE s.next_attempt_at END,
    verify_at       = CASE WHEN s.verify_at > now() THEN now() ELSE s.verify_at END,
    owner           = NULL
FROM dead
WHERE s.trip_id = dead.trip_id AND s.step = dead.step
RETURNING s.trip_id, s.step, dead.owner::int AS dead_owner;

-- name: ProcessUnlock :one
SELECT pg_advisory_unlock(@namespace::int, @id::int) AS unlocked;

-- name: ProcessPredecessorIDs :many
-- Earlier processes of the same instance name not marked gone.
SELECT id FROM processes WHERE instance = @instance AND id <> @id AND gone_at IS NULL;
