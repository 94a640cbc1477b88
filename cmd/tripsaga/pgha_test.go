package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPGHAFlagsRefuse: up --pg-ha and chaos --pg-ha refuse, naming the
// package to install, when pg_autoctl is not on PATH; up --pg-ha refuses
// a DATABASE_URL; chaos refuses the pg-failover kind without --pg-ha.
func TestPGHAFlagsRefuse(t *testing.T) {
	execute := func(args ...string) error {
		var out bytes.Buffer
		cmd := rootCmd()
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		return cmd.Execute()
	}
	t.Setenv("DATABASE_URL", "")
	t.Setenv("PATH", t.TempDir()) // no pg_autoctl there
	err := execute("up", "--pg-ha", "--dir", t.TempDir())
	require.ErrorContains(t, err, "--pg-ha needs pg_autoctl")
	require.ErrorContains(t, err, "postgresql-15-auto-failover")
	err = execute("chaos", "--pg-ha", "--faults", "pg-failover", "--dir", t.TempDir())
	require.ErrorContains(t, err, "postgresql-15-auto-failover")

	t.Setenv("DATABASE_URL", "postgres://u@h/db")
	require.ErrorContains(t, execute("up", "--pg-ha", "--dir", t.TempDir()), "unset DATABASE_URL")

	err = execute("chaos", "--faults", "kill,pg-failover", "--dir", t.TempDir())
	require.ErrorContains(t, err, "pg-failover needs a PostgreSQL HA pair (--pg-ha")

	var help bytes.Buffer
	cmd := rootCmd()
	cmd.SetOut(&help)
	cmd.SetArgs([]string{"up", "--help"})
	require.NoError(t, cmd.Execute())
	require.True(t, strings.Contains(help.String(), "--pg-ha") && strings.Contains(help.String(), "target_session_attrs=read-write"), help.String())
}
