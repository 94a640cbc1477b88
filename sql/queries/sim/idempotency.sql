-- name: IdempotencyClaim :one
-- Claims key for this transaction. Returns no row when the key is already
-- stored; waits while another transaction holds an uncommitted claim.
INSERT INTO idempotency (key, op, fingerprint, request)
VALUES (@key, @op, @fingerprint, @request)
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: IdempotencyGet :one
SELECT * FROM idempotency WHERE key = @key;

-- name: IdempotencySetAnswer :exec
UPDATE idempotency SET status_code = @status_code, response = @response
WHERE key = @key;
