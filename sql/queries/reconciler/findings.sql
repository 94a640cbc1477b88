-- name: FindingUpsertMany :exec
-- Records every finding that holds now: a new row, or last_seen and detail
-- of the open one.
INSERT INTO findings (trip_id, kind, detail, first_seen, last_seen)
SELECT f.trip_id, f.kind, f.detail, @now::timestamptz, @now::timestamptz
FROM (SELECT unnest(@trip_ids::text[]) AS trip_id, unnest(@kinds::text[]) AS kind,
             unnest(@details::text[]) AS detail) AS f
ON CONFLICT (trip_id, kind) WHERE resolved_at IS NULL
DO UPDATE SET detail = EXCLUDED.detail, last_seen = EXCLUDED.last_seen;

-- name: FindingResolveOthers :execrows
-- Resolves every open finding that is not among the ones that hold now.
UPDATE findings AS f SET resolved_at = @now::timestamptz
WHERE f.resolved_at IS NULL
  AND NOT EXISTS (
    SELECT 1 FROM (SELECT unnest(@trip_ids::text[]) AS trip_id, unnest(@kinds::text[]) AS kind) AS c
    WHERE c.trip_id = f.trip_id AND c.kind = f.kind);

-- name: FindingListOpen :many
-- Open findings that no operator dismissed.
SELECT * FROM findings WHERE resolved_at IS NULL AND dismissed_at IS NULL ORDER BY first_seen, id;

-- name: FindingList :many
-- Open and resolved findings, newest first.
SELECT * FROM findings ORDER BY id DESC LIMIT @max;

-- name: FindingListByTrip :many
SELECT * FROM findings WHERE trip_id = @trip_id ORDER BY id;

-- name: FindingCountOpenByKind :many
-- Open findings that no operator dismissed, by kind.
SELECT kind, count(*) AS findings FROM findings WHERE resolved_at IS NULL AND dismissed_at IS NULL GROUP BY kind ORDER BY kind;

-- name: FindingDismiss :execrows
-- An operator dismisses the open finding (trip_id, kind), with why.
UPDATE findings SET dismissed_at = @now::timestamptz, dismissed_by = @operator::text, dismiss_reason = @reason::text
WHERE trip_id = @trip_id AND kind = @kind AND resolved_at IS NULL AND dismissed_at IS NULL;
