package natsauth_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/natsauth"
)

// The generated configuration parses with nats-server's own parser, the
// public keys coming from the included file Provision writes, and gives
// every identity the permissions the Go definitions say.
func TestServerConfParses(t *testing.T) {
	dir := t.TempDir()
	ids := natsauth.Identities(events.Default)
	pubs, err := natsauth.Provision(filepath.Join(dir, "auth"), ids)
	if err != nil {
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
	if len(opts.Nkeys) != len(ids) {
		t.Fatalf("%d users, want %d", len(opts.Nkeys), len(ids))
	}
	for i, id := range ids {
		u := opts.Nkeys[i]
		if u.Nkey != pubs[id.Name] {
			t.Errorf("%s: nkey %q, want %q", id.Name, u.Nkey, pubs[id.Name])
		}
		if got, want := u.Permissions.Publish.Allow, id.PublishAllow(); !equal(got, want) {
			t.Errorf("%s publish %v, want %v", id.Name, got, want)
		}
		if got, want := u.Permissions.Subscribe.Allow, id.SubscribeAllow(); !equal(got, want) {
			t.Errorf("%s subscribe %v, want %v", id.Name, got, want)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
