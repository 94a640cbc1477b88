-- name: OperatorActionInsert :execrows
-- Records an action; a key already recorded is left alone (0 rows).
INSERT INTO operator_actions (event_id, idempotency_key, fingerprint, action, trip_id, service, operator, reason,
                              deadletter_seq, event, created_at)
VALUES (@event_id, @idempotency_key, @fingerprint, @action, @trip_id, @service, @operator, @reason,
        sqlc.narg(deadletter_seq)::bigint, @event, @created_at)
ON CONFLICT (idempotency_key) DO NOTHING;

-- name: OperatorActionGetByKey :one
SELECT * FROM operator_actions WHERE idempotency_key = @idempotency_key;

-- name: OperatorActionList :many
-- The newest actions first, of one trip when trip_id is not empty.
SELECT * FROM operator_actions
WHERE (@trip_id::text = '' OR trip_id = @trip_id::text)
ORDER BY created_at DESC, event_id DESC
LIMIT @max;

-- name: OperatorActionRedrives :many
-- The redrive actions of the given dead letters.
SELECT deadletter_seq, event_id FROM operator_actions
WHERE action = 'redrive' AND deadletter_seq = ANY(@seqs::bigint[])
ORDER BY created_at;

-- name: OperatorActionGet :one
SELECT * FROM operator_actions WHERE event_id = @event_id;

-- name: OperatorActionListByKeyPrefix :many
-- The actions recorded under keys starting with prefix, in the order they
-- were recorded (event ids are ULIDs): a re-drive from a step records one
-- action per delivery, under "<Idempotency-Key>/<consumer>/<event id>".
SELECT * FROM operator_actions WHERE starts_with(idempotency_key, @prefix::text) ORDER BY event_id;
