package tlstrust

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCAFileRefusesAFileWithoutCertificates(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(file, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CAFile(file); err == nil || err.Error() != file+" holds no PEM certificate" {
		t.Errorf("CAFile of a file without PEM: %v", err)
	}
	if _, err := CAFile(filepath.Join(t.TempDir(), "missing.pem")); err == nil {
		t.Error("CAFile of a missing file: no error")
	}
}

// A server passes when any one of its verified chains is short enough.
func TestMaxChainCountsTheShortestVerifiedChain(t *testing.T) {
	chain := func(n int) []*x509.Certificate { return make([]*x509.Certificate, n) }
	check := MaxChain(2, "tls_max_chain")
	if err := check(tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{chain(3), chain(2)}}); err != nil {
		t.Errorf("a chain of 2 among them: %v", err)
	}
	err := check(tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{chain(3), chain(4)}})
	if err == nil || !strings.HasPrefix(err.Error(), "tls_max_chain: ") || !strings.Contains(err.Error(), "longer than 2 certificates") {
		t.Errorf("only chains of 3 and 4: %v", err)
	}
}
