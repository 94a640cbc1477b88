package stack

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/process"
)

// AuthDir is the folder, in a stack's Dir, of the NATS identities: one
// user nkey seed per identity (auth/hotel.nk..., mode 0600, kept across
// runs) and their public keys (auth/nkeys.conf).
const AuthDir = "auth"

// NATSConf is the server configuration, in a stack's Dir, that the nodes
// of a cluster (`tripsaga serve nats --config`) read their users from: the
// same file as compose's deploy/nats/nats-server.conf.
const NATSConf = "nats-server.conf"

// Creds returns the seed file (NATS_CREDS) of identity name: a service,
// or natsauth.Admin for tools.
func (s *Stack) Creds(name string) string {
	return natsauth.CredsFile(filepath.Join(s.cfg.Dir, AuthDir), name)
}

// natsCatalogue is the catalogue the stack's processes run (STEPS of
// Config.Env, else of the environment), whose identities the server
// requires; the default one when STEPS is invalid (Start refuses it).
func (s *Stack) natsCatalogue() events.Catalogue {
	v := os.Getenv(events.StepsVar)
	for _, kv := range s.cfg.Env {
		if x, ok := strings.CutPrefix(kv, events.StepsVar+"="); ok {
			v = x
		}
	}
	c, err := events.ParseSteps(v)
	if err != nil {
		return events.Default
	}
	return c
}

// provisionNATS writes the identities' seeds and the server configuration
// into the stack's folder and returns the identities and their public keys.
func (s *Stack) provisionNATS() ([]natsauth.Identity, map[string]string, error) {
	c := s.natsCatalogue()
	ids := natsauth.Identities(c)
	pubs, err := natsauth.Provision(filepath.Join(s.cfg.Dir, AuthDir), ids)
	if err != nil {
		return nil, nil, fmt.Errorf("stack: %w", err)
	}
	if err := os.WriteFile(filepath.Join(s.cfg.Dir, NATSConf), natsauth.ServerConf(c), 0o644); err != nil {
		return nil, nil, fmt.Errorf("stack: %w", err)
	}
	return ids, pubs, nil
}

// natsEnv is the NATS identity of an instance: NATS_CREDS of its process
// (hotel-2 is hotel), none for the simulators and the NATS nodes.
func (s *Stack) natsEnv(instance string) []string {
	for _, in := range s.insts {
		if in.name != instance {
			continue
		}
		if _, ok := natsauth.Lookup(s.natsCatalogue(), in.process); ok {
			return []string{natsauth.EnvCreds + "=" + s.Creds(in.process)}
		}
	}
	return nil
}

// ConnectNATS connects to the stack's NATS as identity (a service, or
// natsauth.Admin for a tool or a test), with the options given.
func (s *Stack) ConnectNATS(identity string, opts ...nats.Option) (*nats.Conn, error) {
	env := process.Env{NATSURL: s.NATSURL, NATSClient: natsauth.Client{Creds: s.Creds(identity)}}
	return process.ConnectNATS(env, identity, append([]nats.Option{nats.Timeout(5 * time.Second)}, opts...)...)
}
