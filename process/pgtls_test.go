package process

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tripsaga/tripsaga/internal/pgcluster"
	"github.com/tripsaga/tripsaga/internal/pgroles"
	tripsql "github.com/tripsaga/tripsaga/sql"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serverCert returns a certificate for 127.0.0.1 signed by ca, and its key,
// in PEM.
func (ca testCA) serverCert(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// TestPostgresTLSVerifyFull: a private cluster with ssl=on and a server
// certificate from a test CA; a service's DATABASE_URL with
// sslmode=verify-full and sslrootcert=<the CA> migrates and serves (Open:
// migrations and pool, as its own role), and with another CA it is
// refused, the error saying the certificate is not trusted.
func TestPostgresTLSVerifyFull(t *testing.T) {
	if _, err := pgcluster.FindBinaries(); err != nil {
		t.Skip(err)
	}
	base, err := os.MkdirTemp("", "pgtls-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	require.NoError(t, os.Chmod(base, 0o711)) // the postgres OS user (run as root) reaches base/pg
	dir := filepath.Join(base, "pg")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	ca := newTestCA(t, "tripsaga test CA")
	certPEM, keyPEM := ca.serverCert(t)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "server.crt"), certPEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "server.key"), keyPEM, 0o600))
	caFile := filepath.Join(base, "ca.pem")
	require.NoError(t, os.WriteFile(caFile, ca.pem, 0o644))
	wrongFile := filepath.Join(base, "wrong-ca.pem")
	require.NoError(t, os.WriteFile(wrongFile, newTestCA(t, "another CA").pem, 0o644))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Dir: dir, Settings: map[string]string{
		"ssl": "on", "ssl_cert_file": filepath.Join(dir, "server.crt"), "ssl_key_file": filepath.Join(dir, "server.key"),
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })

	withTLS := func(u, root string) string {
		pu, err := url.Parse(u)
		require.NoError(t, err)
		q := pu.Query()
		q.Set("sslmode", "verify-full")
		q.Set("sslrootcert", root)
		pu.RawQuery = q.Encode()
		return pu.String()
	}
	admin := withTLS(c.URL, caFile)
	urls, err := pgroles.Bootstrap(ctx, admin, pgroles.Default(), pgroles.Passwords(pgroles.Default()))
	require.NoError(t, err)

	p, err := Open(ctx, "hotel", "hotel", Env{DatabaseURL: urls["hotel"]}, false, tripsql.SetSaga)
	require.NoError(t, err)
	defer p.Close()
	var ssl bool
	require.NoError(t, p.Pool.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl))
	require.True(t, ssl, "the pool's connection is not TLS")
	var n int
	require.NoError(t, p.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n))

	wrong := withTLS(urls["payment"], wrongFile)
	_, err = Open(ctx, "payment", "payment", Env{DatabaseURL: wrong}, false, tripsql.SetSaga)
	require.Error(t, err)
	require.Contains(t, err.Error(), "not trusted")
	require.Contains(t, err.Error(), "sslrootcert")
	pu, err2 := url.Parse(wrong)
	require.NoError(t, err2)
	pw, _ := pu.User.Password()
	require.NotContains(t, err.Error(), pw)
}
