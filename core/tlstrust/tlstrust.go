// Package tlstrust builds what a store's TLS client trusts from its
// config, one way for every store: the certificates of a CA file, and a
// bound on the length of the chain a server's certificate verifies through.
package tlstrust

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// CAFile returns the certificates in the PEM file at path, for
// tls.Config.RootCAs; a file with none is an error.
func CAFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return roots, nil
}

// MaxChain returns a tls.Config.VerifyConnection that accepts a server
// only if its certificate verifies through a chain of at most most
// certificates (the server's own and the trusted CA's included: 2 is a
// certificate a trusted CA signed directly). Its error starts with
// setting, the config field that set most.
func MaxChain(most int, setting string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		for _, chain := range cs.VerifiedChains {
			if len(chain) <= most {
				return nil
			}
		}
		return fmt.Errorf("%s: the server's certificate verifies only through a chain longer than %d certificates", setting, most)
	}
}
