package redis

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
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/internal/redistest"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA certificate, PEM
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{cert: cert, key: key, file: filepath.Join(dir, name+".pem")}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue writes a server certificate for 127.0.0.1 and its key, and
// returns their files.
func (ca *testCA) issue(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "redis"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"redis.test"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
	return certFile, keyFile
}

func writePEM(t *testing.T, file, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTLS: a real redis-server speaking TLS with certificates made at test
// time. The store verifies the server against tls_ca and decides; a CA
// that did not sign the server's certificate, a name the certificate does
// not carry, and a CA file with no certificate are refused with errors that
// say so.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := newTestCA(t, dir, "tollgate-test-ca"), newTestCA(t, dir, "another-ca")
	certFile, keyFile := ca.issue(t, dir)
	tlsPort, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// The plain port stays for redistest's readiness PING; the store only
	// uses the TLS port.
	srv, err := redistest.Start(dir, "--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", certFile,
		"--tls-key-file", keyFile, "--tls-ca-cert-file", ca.file, "--tls-auth-clients", "no")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	addr := "127.0.0.1:" + strconv.Itoa(tlsPort)
	p := core.MustPolicy("tls", core.PolicyOptions{}, algo.Limit{Count: 2, Window: time.Minute})
	decide := func(o Options) (core.Decision, error) {
		o.Timeout = algo.Duration(2 * time.Second)
		s := newStore(t, o)
		var d core.Decision
		err := s.Decide(context.Background(), p, "k", 1, &d)
		return d, err
	}
	if d, err := decide(Options{Settings: Settings{Addrs: []string{addr}, TLSCA: ca.file}}); err != nil || !d.Allowed {
		t.Fatalf("TLS verified by tls_ca: %v %+v", err, d)
	}
	if d, err := decide(Options{Settings: Settings{URL: "rediss://" + addr, TLSCA: ca.file, TLSServerName: "redis.test"}}); err != nil || !d.Allowed {
		t.Fatalf("rediss:// URL with the name the certificate carries: %v %+v", err, d)
	}
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Settings: Settings{Addrs: []string{addr}, TLSCA: other.file}}, "certificate signed by unknown authority"},
		{Options{Settings: Settings{Addrs: []string{addr}, TLSCA: ca.file, TLSServerName: "elsewhere.test"}}, "not elsewhere.test"},
	} {
		if _, err := decide(c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("TLSCA %s, name %q: error %v, want one saying %q", filepath.Base(c.o.TLSCA), c.o.TLSServerName, err, c.want)
		}
	}
	if _, err := New(Options{Settings: Settings{Addrs: []string{addr}, TLSCA: keyFile}}); err == nil || !strings.Contains(err.Error(), "tls_ca: "+keyFile+" holds no PEM certificate") {
		t.Errorf("a CA file without a certificate: %v", err)
	}
	if _, err := New(Options{Settings: Settings{Addrs: []string{addr}, TLSCA: filepath.Join(dir, "missing.pem")}}); err == nil || !strings.Contains(err.Error(), "tls_ca: open") {
		t.Errorf("a missing CA file: %v", err)
	}
}
