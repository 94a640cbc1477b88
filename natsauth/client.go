package natsauth

import (
	"cmp"
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
)

// Environment variables a process reads to connect to NATS (besides
// NATS_URL, which may start with tls://).
const (
	// EnvCreds names the file of the process's NATS identity: a user nkey
	// seed ([CredsExt]). Unset: the process connects without credentials
	// (a server without users).
	EnvCreds = "NATS_CREDS" //nolint:gosec // the name of a variable, not a credential
	// EnvNkey is the nats CLI's variable for the same kind of file (an
	// nkey seed); a process reads it when [EnvCreds] is unset, so one
	// `up.env` serves the tools and the nats CLI, which reads NATS_CREDS
	// as a JWT creds file and would refuse a bare seed.
	EnvNkey = "NATS_NKEY"
	// EnvCAFile names a PEM file of the CA certificates that sign the NATS
	// server's TLS certificate (with a tls:// NATS_URL, or a server that
	// requires TLS). Unset: the system's roots.
	EnvCAFile = "NATS_CA_FILE"
	// EnvCertFile and EnvKeyFile name the PEM certificate and key the
	// process presents when the server verifies clients (both or neither).
	EnvCertFile = "NATS_CERT_FILE"
	EnvKeyFile  = "NATS_KEY_FILE"
)

// Client is how a process authenticates to NATS and checks its server.
type Client struct {
	Creds    string // NATS_CREDS: nkey seed file
	CAFile   string // NATS_CA_FILE
	CertFile string // NATS_CERT_FILE
	KeyFile  string // NATS_KEY_FILE
}

// ClientFromEnv reads [Client] from NATS_CREDS (or, unset, NATS_NKEY),
// NATS_CA_FILE, NATS_CERT_FILE and NATS_KEY_FILE.
func ClientFromEnv() Client {
	return Client{
		Creds: cmp.Or(os.Getenv(EnvCreds), os.Getenv(EnvNkey)), CAFile: os.Getenv(EnvCAFile),
		CertFile: os.Getenv(EnvCertFile), KeyFile: os.Getenv(EnvKeyFile),
	}
}

// Options returns the connect options of identity name (a service or
// [Admin]) for c: its inbox prefix ([InboxPrefix]), its nkey from the seed
// file, the CA to verify the server with and the client certificate. An
// error names the variable whose file cannot be used; the seed itself is
// never part of an error or a log.
func (c Client) Options(name string) ([]nats.Option, error) {
	opts := []nats.Option{nats.CustomInboxPrefix(InboxPrefix(name))}
	var errs []error
	if c.Creds != "" {
		o, err := nats.NkeyOptionFromSeed(c.Creds)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%s: %w", EnvCreds, c.Creds, err))
		} else {
			opts = append(opts, o)
		}
	}
	if c.CAFile != "" {
		if _, err := os.Stat(c.CAFile); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvCAFile, err))
		}
		opts = append(opts, nats.RootCAs(c.CAFile))
	}
	switch {
	case c.CertFile != "" && c.KeyFile != "":
		opts = append(opts, nats.ClientCert(c.CertFile, c.KeyFile))
	case c.CertFile != "" || c.KeyFile != "":
		errs = append(errs, fmt.Errorf("%s and %s: set both or neither", EnvCertFile, EnvKeyFile))
	}
	return opts, errors.Join(errs...)
}

// Options is [ClientFromEnv]().Options(name).
func Options(name string) ([]nats.Option, error) { return ClientFromEnv().Options(name) }
