package redis

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/internal/redistest"
)

// TestTLS: a real redis-server speaking TLS with certificates made at test
// time. The store verifies the server against tls_ca and decides; a CA
// that did not sign the server's certificate, a name the certificate does
// not carry, and a CA file with no certificate are refused with errors that
// say so.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := redistest.NewCA(t, dir, "tollgate-test-ca"), redistest.NewCA(t, dir, "another-ca")
	_, addr := redistest.StartTLST(t, ca)
	notPEM := filepath.Join(dir, "not-a-certificate.pem")
	if err := os.WriteFile(notPEM, []byte("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := core.MustPolicy("tls", core.PolicyOptions{}, algo.Limit{Count: 2, Window: time.Minute})
	decide := func(o Options) (core.Decision, error) {
		o.Timeout = algo.Duration(2 * time.Second)
		s := newStore(t, o)
		var d core.Decision
		err := s.Decide(context.Background(), p, "k", 1, &d)
		return d, err
	}
	if d, err := decide(Options{Settings: Settings{Addrs: []string{addr}, TLSCA: ca.File}}); err != nil || !d.Allowed {
		t.Fatalf("TLS verified by tls_ca: %v %+v", err, d)
	}
	if d, err := decide(Options{Settings: Settings{Addrs: []string{addr}, TLSCA: ca.File, TLSMaxChain: 2}}); err != nil || !d.Allowed {
		t.Fatalf("TLS verified through a chain of 2, at most 2 allowed: %v %+v", err, d)
	}
	if d, err := decide(Options{Settings: Settings{URL: "rediss://" + addr, TLSCA: ca.File, TLSServerName: "redis.test"}}); err != nil || !d.Allowed {
		t.Fatalf("rediss:// URL with the name the certificate carries: %v %+v", err, d)
	}
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Settings: Settings{Addrs: []string{addr}, TLSCA: other.File}}, "certificate signed by unknown authority"},
		{Options{Settings: Settings{Addrs: []string{addr}, TLSCA: ca.File, TLSServerName: "elsewhere.test"}}, "not elsewhere.test"},
		// The server's certificate and the CA that signed it: a chain of 2.
		{Options{Settings: Settings{Addrs: []string{addr}, TLSCA: ca.File, TLSMaxChain: 1}}, "longer than 1 certificates"},
	} {
		if _, err := decide(c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("TLSCA %s, name %q: error %v, want one saying %q", filepath.Base(c.o.TLSCA), c.o.TLSServerName, err, c.want)
		}
	}
	if _, err := New(Options{Settings: Settings{Addrs: []string{addr}, TLSCA: notPEM}}); err == nil || !strings.Contains(err.Error(), "tls_ca: "+notPEM+" holds no PEM certificate") {
		t.Errorf("a CA file without a certificate: %v", err)
	}
	if _, err := New(Options{Settings: Settings{Addrs: []string{addr}, TLSCA: filepath.Join(dir, "missing.pem")}}); err == nil || !strings.Contains(err.Error(), "tls_ca: open") {
		t.Errorf("a missing CA file: %v", err)
	}
}
