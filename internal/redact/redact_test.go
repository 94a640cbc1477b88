package redact_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/redact"
)

func TestMasks(t *testing.T) {
	require.Equal(t, "a***@example.com", redact.Email("ada@example.com"))
	require.Equal(t, "***", redact.Email("nobody"))
	require.Equal(t, "***4242", redact.Token("tok_visa_4242424242"))
	require.Equal(t, "***", redact.Token("tok_declined"[:8]))
	got := string(redact.JSON([]byte(`{"trip_id":"T-1","traveler":{"name":"Ada","email":"ada@example.com"},"payment":{"card_token":"tok_visa_4242424242","amount_cents":1200},"list":[{"to":"bob@example.org"}]}`)))
	require.NotContains(t, got, "ada@example.com")
	require.NotContains(t, got, "tok_visa_4242424242")
	require.NotContains(t, got, "bob@example.org")
	require.Contains(t, got, `"amount_cents":1200`)
	require.Contains(t, got, `"a***@example.com"`)
	require.Equal(t, "not json", string(redact.JSON([]byte("not json"))))
	require.Equal(t, "mail to a***@example.com failed", redact.Text("mail to ada@example.com failed"))
}

func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://hotel:s3cret@127.0.0.1:5432/tripsaga?sslmode=verify-full": "postgres://hotel:xxxxx@127.0.0.1:5432/tripsaga?sslmode=verify-full",
		"postgres://127.0.0.1/db?user=x&password=s3cret":                      "postgres://127.0.0.1/db?password=xxxxx&user=x",
		"nats://a:s3cret@n1:4222,nats://a:s3cret@n2:4222":                     "nats://a:xxxxx@n1:4222,nats://a:xxxxx@n2:4222",
		"host=db user=hotel password=s3cret dbname=x":                         "host=db user=hotel password=xxxxx dbname=x",
		"host=db password='s 3cret' dbname=x":                                 "host=db password=xxxxx dbname=x",
		"nats://127.0.0.1:4222":                                               "nats://127.0.0.1:4222",
	} {
		require.Equal(t, want, redact.URL(in), in)
	}
}
