package stack

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/natsauth"
)

// Each child gets its process's own NATS identity (hotel-2 is hotel), the
// simulators and the NATS nodes none; the seeds are written 0600 into
// Dir/auth with the server configuration the nodes read next to them; the
// tools' up.env names the admin's.
func TestNATSIdentityOfEachChild(t *testing.T) {
	dir := t.TempDir()
	s := &Stack{cfg: Config{Dir: dir}}
	s.insts = append(s.insts, []*instance{
		{name: "nats-1", process: "nats"}, {name: "sim", process: "sim"},
		{name: "hotel", process: "hotel"}, {name: "hotel-2", process: "hotel"}, {name: "reconciler-2", process: "reconciler"},
	}...)
	ids, pubs, err := s.provisionNATS()
	require.NoError(t, err)
	require.Len(t, pubs, len(ids))
	for _, id := range ids {
		st, err := os.Stat(s.Creds(id.Name))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), id.Name)
	}
	_, err = os.Stat(filepath.Join(dir, NATSConf))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, AuthDir, natsauth.NkeysConf))
	require.NoError(t, err)

	require.Equal(t, []string{natsauth.EnvCreds + "=" + s.Creds("hotel")}, s.natsEnv("hotel-2"))
	require.Equal(t, []string{natsauth.EnvCreds + "=" + s.Creds("reconciler")}, s.natsEnv("reconciler-2"))
	require.Empty(t, s.natsEnv("sim"))
	require.Empty(t, s.natsEnv("nats-1"))
	require.True(t, slices.ContainsFunc(ids, func(id natsauth.Identity) bool { return id.Name == natsauth.Admin }))
}

// The operators' token reaches the reconciler's instances only, whether it
// comes from up's own environment or from Config.Env.
func TestOperatorTokenOnlyToTheReconciler(t *testing.T) {
	t.Setenv("OPERATOR_TOKEN", "from-up")
	s := &Stack{cfg: Config{Dir: t.TempDir(), Env: []string{"OPERATOR_TOKEN=from-config"}}, Addr: map[string]string{}}
	s.insts = append(s.insts, []*instance{
		{name: "sim", process: "sim"}, {name: "hotel", process: "hotel"}, {name: "trips", process: "trips"},
		{name: "reconciler", process: "reconciler"}, {name: "reconciler-2", process: "reconciler"},
	}...)
	token := func(env []string) []string {
		return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return !strings.HasPrefix(kv, "OPERATOR_TOKEN=") })
	}
	for _, name := range []string{"sim", "hotel", "trips"} {
		require.Empty(t, token(s.env(name)), name)
	}
	for _, name := range []string{"reconciler", "reconciler-2"} {
		got := token(s.env(name))
		require.Equal(t, "OPERATOR_TOKEN=from-config", got[len(got)-1], name)
	}
}
