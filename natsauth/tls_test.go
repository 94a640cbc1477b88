package natsauth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tripsaga/tripsaga/internal/testenv"
	"github.com/tripsaga/tripsaga/natsauth"
	"github.com/tripsaga/tripsaga/process"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue makes a certificate signed by ca for 127.0.0.1 (server) or a
// client, and returns it as a tls.Certificate and as PEM files in dir.
func (ca testCA) issue(t *testing.T, dir, name string, usage x509.ExtKeyUsage) (tls.Certificate, string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	certFile, keyFile := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair, certFile, keyFile
}

func writeCA(t *testing.T, dir, name string, ca testCA) string {
	t.Helper()
	f := filepath.Join(dir, name)
	if err := os.WriteFile(f, ca.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestTLS: the embedded server serves TLS only, with a certificate from a
// CA made in the test, and verifies client certificates from that CA. A
// process connects through it with NATS_URL tls://..., the CA from
// NATS_CA_FILE and its certificate from NATS_CERT_FILE/NATS_KEY_FILE,
// as its own identity (NATS_CREDS), and process.Open starts on it; a CA that
// did not sign the server's certificate is refused with an error naming
// NATS_CA_FILE.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "tripsaga test CA")
	serverCert, _, _ := ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	_, clientCert, clientKey := ca.issue(t, dir, "hotel", x509.ExtKeyUsageClientAuth)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	srv, _ := testenv.NATSWith(t, func(o *server.Options) {
		o.TLSConfig = &tls.Config{
			Certificates: []tls.Certificate{serverCert}, ClientCAs: roots,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
		}
		o.TLS, o.TLSVerify, o.TLSTimeout = true, true, 5
	})
	url := "tls://" + srv.Addr().String()
	caFile := writeCA(t, dir, "ca.pem", ca)

	env := process.Env{
		NATSURL: url, DatabaseURL: testenv.Postgres(t), HTTPAddr: "127.0.0.1:0",
		NATSClient: natsauth.Client{
			Creds: testenv.Creds(t, srv, "hotel"), CAFile: caFile,
			CertFile: clientCert, KeyFile: clientKey,
		},
	}
	ctx := context.Background()
	p, err := process.Open(ctx, "hotel", "hotel", env, true)
	if err != nil {
		t.Fatalf("process.Open over TLS: %v", err)
	}
	defer p.Close()
	if !p.NATS.TLSRequired() {
		t.Fatal("the connection is not TLS")
	}
	st, err := p.NATS.TLSConnectionState()
	if err != nil || !st.HandshakeComplete {
		t.Fatalf("TLS state: %+v, %v", st, err)
	}
	// It is the hotel: its stream was made, and it may do no more.
	if _, err := p.JS.Stream(ctx, "HOTEL"); err != nil {
		t.Fatalf("HOTEL after process.Open: %v", err)
	}
	if _, err := p.JS.Publish(shortCtx(t), "payment.charged.T-1", []byte(`{}`)); err == nil {
		t.Fatal("hotel published payment.charged over TLS")
	}
	if _, err := p.JS.Publish(ctx, "hotel.held.T-1", []byte(`{}`), jetstream.WithMsgID("x")); err != nil {
		t.Fatalf("hotel.held over TLS: %v", err)
	}

	// A CA that did not sign the server's certificate.
	other := newCA(t, "another CA")
	wrong := env
	wrong.NATSClient.CAFile = writeCA(t, dir, "other.pem", other)
	_, err = process.ConnectNATS(wrong, "hotel")
	if err == nil {
		t.Fatal("connected with a CA that did not sign the server's certificate")
	}
	for _, want := range []string{natsauth.EnvCAFile, "not trusted", "certificate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("wrong CA: %q does not say %q", err, want)
		}
	}
	// Without a client certificate the server refuses the handshake.
	nocert := env
	nocert.NATSClient.CertFile, nocert.NATSClient.KeyFile = "", ""
	if nc, err := process.ConnectNATS(nocert, "hotel"); err == nil {
		nc.Close()
		t.Fatal("connected without a client certificate")
	}
	// A missing CA file is named.
	missing := env
	missing.NATSClient.CAFile = filepath.Join(dir, "nope.pem")
	if _, err := process.ConnectNATS(missing, "hotel"); err == nil || !strings.Contains(err.Error(), natsauth.EnvCAFile) {
		t.Fatalf("missing CA file: %v", err)
	}
}

func TestMain(m *testing.M) { testenv.Main(m) }
