package natssync_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/natssync"
	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
)

// The configuration compose ships (deploy/nats/nats-server.conf, as
// natsauth.ServerConf makes it), read by nats-server's own parser, syncs
// always; so does every test server of testenv, as the running server
// itself reports it.
func TestTheConfigurationAndTheTestServersSyncAlways(t *testing.T) {
	dir := t.TempDir()
	if _, err := natsauth.Provision(filepath.Join(dir, "auth"), natsauth.Identities(events.Default)); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(conf, natsauth.ServerConf(events.Default), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server cannot read the generated configuration: %v", err)
	}
	if !opts.SyncAlways {
		t.Errorf("the generated configuration: SyncAlways false (sync every %s)", opts.SyncInterval)
	}
	s := testenv.NATS(t)
	if c := s.JetStreamConfig(); c == nil || !c.SyncAlways {
		t.Errorf("a testenv server's JetStream configuration %+v: want SyncAlways", c)
	}
}

// The words doctor prints for each setting.
func TestSettingWords(t *testing.T) {
	for _, c := range []struct {
		s       natssync.Setting
		word    string
		riskHas string
	}{
		{natssync.Setting{Always: true, Interval: 2 * time.Minute}, "always", "loses no acknowledged event"},
		{natssync.Setting{}, "2m0s (the default)", "of the last 2m0s"},
		{natssync.Setting{Interval: 2 * time.Minute}, "2m0s (the default)", "of the last 2m0s"},
		{natssync.Setting{Interval: time.Second}, "1s", "of the last 1s"},
	} {
		if got := c.s.String(); got != c.word {
			t.Errorf("%+v: %q, want %q", c.s, got, c.word)
		}
		if got := c.s.Risk(); !strings.Contains(got, c.riskHas) {
			t.Errorf("%+v: risk %q lacks %q", c.s, got, c.riskHas)
		}
	}
}
