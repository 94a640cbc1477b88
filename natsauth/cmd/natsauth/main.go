// Command natsauth writes, from the identities natsauth derives
// from the event catalogue, compose's NATS server configuration
// (deploy/nats/nats-server.conf) and SECURITY.md's NATS table. Run it from
// the repository root (go run ./natsauth/cmd/natsauth), or with
// -root; go generate ./events runs it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/natsauth"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "natsauth:", err)
		os.Exit(1)
	}
}

func run() error {
	root := flag.String("root", ".", "the repository's root `folder`")
	flag.Parse()
	if err := os.Chdir(*root); err != nil {
		return err
	}
	if err := os.WriteFile(natsauth.ConfPath, natsauth.ServerConf(events.Default), 0o644); err != nil {
		return err
	}
	doc, err := os.ReadFile(natsauth.SecurityPath)
	if err != nil {
		return err
	}
	out, err := natsauth.ReplaceRegion(string(doc), natsauth.SecurityTable(events.Default))
	if err != nil {
		return fmt.Errorf("%s: %w", natsauth.SecurityPath, err)
	}
	return os.WriteFile(natsauth.SecurityPath, []byte(out), 0o644)
}
