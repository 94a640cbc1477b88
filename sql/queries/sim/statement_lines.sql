-- name: StatementLineInsert :one
INSERT INTO statement_lines (card_token, charge_key, trip_id, amount_cents, currency, kind)
VALUES (@card_token, @charge_key, @trip_id, @amount_cents, @currency, @kind)
RETURNING *;

-- name: StatementLineListByCardToken :many
SELECT * FROM statement_lines WHERE card_token = @card_token ORDER BY seq;
