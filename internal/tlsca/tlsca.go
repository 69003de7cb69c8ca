// Package tlsca turns a CA file from the configuration into a TLS client
// configuration that trusts it.
package tlsca

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Config returns a TLS 1.2+ client configuration trusting the PEM
// certificates in caFile; an empty caFile means the system roots.
func Config(caFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return c, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("ca file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("ca file " + caFile + ": no PEM certificate in it")
	}
	c.RootCAs = pool
	return c, nil
}
