package natsauth

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// CredsExt is the extension of an identity's credentials file: a user
// nkey seed ("SU...", the format `nk -gen user` writes), read by
// nats.NkeyOptionFromSeed.
const CredsExt = ".nk"

// NkeysConf is the name of the file [Provision] writes next to the seeds:
// one variable per identity, NKEY_<NAME> = "<public key>", which the
// server configuration ([ServerConf]) includes.
const NkeysConf = "nkeys.conf"

// CredsFile is the path of identity name's seed file in dir.
func CredsFile(dir, name string) string { return filepath.Join(dir, name+CredsExt) }

// Provision makes sure dir holds a seed file for every identity of ids
// (mode 0600; a valid one already there is kept, so a restart keeps the
// keys, and a rotation is deleting the file, see SECURITY.md) and rewrites
// dir/nkeys.conf with their public keys. It returns the public keys by
// identity name. The seeds are never logged.
func Provision(dir string, ids []Identity) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("natsauth: %w", err)
	}
	pubs := map[string]string{}
	var conf bytes.Buffer
	conf.WriteString("# The public nkeys of tripsaga's NATS identities, written by tripsaga\n# (natsauth.Provision) next to their seeds; included by\n# nats-server.conf.\n")
	for _, id := range ids {
		pub, err := ensureSeed(CredsFile(dir, id.Name))
		if err != nil {
			return nil, err
		}
		pubs[id.Name] = pub
		fmt.Fprintf(&conf, "%s = %q\n", confVar(id.Name), pub)
	}
	if err := writeFile(filepath.Join(dir, NkeysConf), conf.Bytes(), 0o644); err != nil {
		return nil, err
	}
	return pubs, nil
}

// ensureSeed returns the public key of the user seed in path, making a new
// one first when the file is missing. A file that holds no user seed is an
// error naming it (it is not overwritten).
func ensureSeed(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		kp, err := nkeys.ParseDecoratedNKey(b)
		if err != nil {
			return "", fmt.Errorf("natsauth: %s holds no nkey seed: %w", path, err)
		}
		defer kp.Wipe()
		pub, err := kp.PublicKey()
		if err != nil || !nkeys.IsValidPublicUserKey(pub) {
			return "", fmt.Errorf("natsauth: %s holds no user nkey seed", path)
		}
		return pub, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("natsauth: %w", err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", fmt.Errorf("natsauth: %w", err)
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return "", fmt.Errorf("natsauth: %w", err)
	}
	if err := writeFile(path, append(seed, '\n'), 0o600); err != nil {
		return "", err
	}
	return kp.PublicKey()
}

// writeFile writes b to path with mode through a temp file and a rename,
// so a reader never sees half a file.
func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("natsauth: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("natsauth: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("natsauth: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("natsauth: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("natsauth: %w", err)
	}
	return nil
}

// confVar is the configuration variable of identity name's public key:
// NKEY_HOTEL.
func confVar(name string) string {
	return "NKEY_" + strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, name)
}

// ServerUsers is the server's users for ids: one nkey user per identity
// (its public key from pubs) with its [Identity.Permissions]. An identity
// without a key in pubs is an error naming it.
func ServerUsers(ids []Identity, pubs map[string]string) ([]*server.NkeyUser, error) {
	var out []*server.NkeyUser
	for _, id := range ids {
		pub, ok := pubs[id.Name]
		if !ok {
			return nil, fmt.Errorf("natsauth: no public key for identity %s", id.Name)
		}
		out = append(out, &server.NkeyUser{Nkey: pub, Permissions: id.Permissions()})
	}
	return out, nil
}

// Configure makes opts (an embedded server's) require one of the users
// of ids, with their permissions. No anonymous client is accepted.
func Configure(opts *server.Options, ids []Identity, pubs map[string]string) error {
	users, err := ServerUsers(ids, pubs)
	if err != nil {
		return err
	}
	opts.Nkeys = users
	return nil
}
