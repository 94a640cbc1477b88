package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/natsauth"
)

// TestNATSAuthCmd: `tripsaga nats-auth --dir D --conf F` (what compose runs
// before its NATS server starts) writes a seed per identity (0600) and the
// public keys, prints the files and no seed, and the configuration it
// writes is one nats-server reads, with every identity as a user.
func TestNATSAuthCmd(t *testing.T) {
	dir := t.TempDir()
	auth := filepath.Join(dir, "auth")
	conf := filepath.Join(dir, "nats-server.conf")
	cmd := natsAuthCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--dir", auth, "--conf", conf})
	require.NoError(t, cmd.ExecuteContext(context.Background()), out.String())

	ids := natsauth.Identities(events.Selected())
	for _, id := range ids {
		f := natsauth.CredsFile(auth, id.Name)
		require.Contains(t, out.String(), f+"\n")
		st, err := os.Stat(f)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
		seed, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NotContains(t, out.String(), strings.TrimSpace(string(seed)), "a seed was printed")
	}
	opts, err := server.ProcessConfigFile(conf)
	require.NoError(t, err)
	require.Len(t, opts.Nkeys, len(ids))

	// --dir is required.
	cmd = natsAuthCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(nil)
	require.ErrorContains(t, cmd.ExecuteContext(context.Background()), "dir")
}
