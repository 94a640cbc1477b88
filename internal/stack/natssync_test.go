package stack

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/internal/natssync"
	"github.com/tripsaga/tripsaga/natsauth"
)

// Every NATS server up runs fsyncs each message before its PubAck
// (internal/natssync): the single embedded one, and a cluster node of
// `tripsaga serve nats`, with or without the configuration file up writes.
func TestEveryNATSServerOfUpSyncsAlways(t *testing.T) {
	emb := embeddedNATSOptions(t.TempDir(), -1)
	if !emb.SyncAlways {
		t.Errorf("the embedded server's options: SyncAlways false (sync every %s)", emb.SyncInterval)
	}
	dir := t.TempDir()
	if _, err := natsauth.Provision(filepath.Join(dir, "auth"), natsauth.Identities(events.Default)); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, NATSConf)
	if err := os.WriteFile(conf, natsauth.ServerConf(events.Default), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cf := range []string{"", conf} {
		n := NATSNode{Name: "nats-1", Port: 4222, ClusterPort: 6222, StoreDir: t.TempDir(), ConfigFile: cf}
		o, err := n.options()
		if err != nil {
			t.Fatal(err)
		}
		if !o.SyncAlways {
			t.Errorf("a cluster node (config file %q): SyncAlways false (sync every %s)", cf, o.SyncInterval)
		}
	}
	if got := (natssync.Setting{Always: emb.SyncAlways, Interval: emb.SyncInterval}).String(); got != natssync.Policy {
		t.Errorf("setting %q, want %q", got, natssync.Policy)
	}
}
