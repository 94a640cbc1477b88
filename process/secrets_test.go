package process

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/testenv"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// TestPasswordsNotInErrors: a DATABASE_URL or NATS_URL that cannot be
// parsed or reached fails Open with an error that names what failed but
// never the password.
func TestPasswordsNotInErrors(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{
		"postgres://hotel:s3cr3t-pw@127.0.0.1:1/db?connect_timeout=1&sslmode=disable",
		"postgres://hotel:s3cr3t-pw@127.0.0.1:notaport/db",
		"postgres://hotel:s3cr3t-pw@127.0.0.1:1/db?sslmode=nonsense",
		"host=127.0.0.1 port=1 user=hotel password=s3cr3t-pw connect_timeout=1 sslmode=disable",
	} {
		_, err := Open(ctx, "hotel", "hotel", Env{DatabaseURL: u}, false, tripsql.SetSaga)
		require.Error(t, err, u)
		require.NotContains(t, err.Error(), "s3cr3t-pw", u)
	}
	env := Env{NATSURL: "nats://hotel:s3cr3t-pw@127.0.0.1:1", DatabaseURL: testenv.Roles(t, testenv.Postgres(t))["hotel"]}
	_, err := Open(ctx, "hotel", "hotel", env, true, tripsql.SetSaga)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cr3t-pw")
	require.Contains(t, err.Error(), "127.0.0.1:1")
}
