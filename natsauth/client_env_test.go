package natsauth_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/natsauth"
)

// TestClientFromEnvReadsTheNatsCLIsVariable: up.env gives the tools
// admin's seed as NATS_NKEY only (the nats CLI's name; it takes NATS_CREDS
// for a JWT creds file), and a process's own NATS_CREDS wins over it.
func TestClientFromEnvReadsTheNatsCLIsVariable(t *testing.T) {
	t.Setenv(natsauth.EnvCreds, "")
	t.Setenv(natsauth.EnvNkey, "/up/auth/admin.nk")
	require.Equal(t, "/up/auth/admin.nk", natsauth.ClientFromEnv().Creds)
	t.Setenv(natsauth.EnvCreds, "/up/auth/hotel.nk")
	require.Equal(t, "/up/auth/hotel.nk", natsauth.ClientFromEnv().Creds)
}
