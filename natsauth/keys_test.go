package natsauth_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/natsauth"
)

// Provision writes one user seed per identity, readable by its owner only,
// keeps them across calls (a restart keeps the keys), makes a deleted one
// again (a rotation), refuses a file that holds no seed, and writes no
// seed into nkeys.conf.
func TestProvision(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "auth")
	ids := natsauth.Identities(events.Default)
	first, err := natsauth.Provision(dir, ids)
	if err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile(filepath.Join(dir, natsauth.NkeysConf))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		f := natsauth.CredsFile(dir, id.Name)
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, st.Mode().Perm())
		}
		b, _ := os.ReadFile(f)
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		pub, _ := kp.PublicKey()
		if pub != first[id.Name] || !nkeys.IsValidPublicUserKey(pub) {
			t.Errorf("%s: public key %s, Provision said %s", id.Name, pub, first[id.Name])
		}
		if !strings.Contains(string(conf), pub) || strings.Contains(string(conf), strings.TrimSpace(string(b))) {
			t.Errorf("nkeys.conf lacks %s's public key or holds its seed", id.Name)
		}
	}
	again, err := natsauth.Provision(dir, ids)
	if err != nil {
		t.Fatal(err)
	}
	for name, pub := range first {
		if again[name] != pub {
			t.Errorf("%s's key changed on the second Provision", name)
		}
	}
	if err := os.Remove(natsauth.CredsFile(dir, "hotel")); err != nil {
		t.Fatal(err)
	}
	rotated, err := natsauth.Provision(dir, ids)
	if err != nil {
		t.Fatal(err)
	}
	if rotated["hotel"] == first["hotel"] || rotated["payment"] != first["payment"] {
		t.Errorf("a deleted seed is made again and only it: hotel %v, payment %v", rotated["hotel"] != first["hotel"], rotated["payment"] == first["payment"])
	}
	if err := os.WriteFile(natsauth.CredsFile(dir, "car"), []byte("not a seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := natsauth.Provision(dir, ids); err == nil || !strings.Contains(err.Error(), "car.nk") {
		t.Errorf("a file without a seed: %v, want an error naming it", err)
	}
}

// A service's identity can publish only its own events: no two services
// may publish the same event subject, and every published type of the
// catalogue is allowed to exactly its publisher.
func TestEveryEventHasOnePublisher(t *testing.T) {
	for _, c := range []events.Catalogue{events.Default, events.Full()} {
		ids := natsauth.Identities(c)
		for _, et := range c.Types {
			subject := events.Kind(et.Type) + ".T-1"
			var who []string
			for _, id := range ids {
				if !id.All && allows(id.PublishAllow(), subject) {
					who = append(who, id.Name)
				}
			}
			if len(who) != 1 || who[0] != et.Service {
				t.Errorf("%s may be published by %v, want only %s", subject, who, et.Service)
			}
		}
	}
}

// allows is NATS subject matching: * is one token, > the rest.
func allows(patterns []string, subject string) bool {
	st := strings.Split(subject, ".")
outer:
	for _, p := range patterns {
		pt := strings.Split(p, ".")
		for i, tok := range pt {
			if tok == ">" {
				if len(st) > i {
					return true
				}
				continue outer
			}
			if i >= len(st) || (tok != "*" && tok != st[i]) {
				continue outer
			}
		}
		if len(pt) == len(st) {
			return true
		}
	}
	return false
}
