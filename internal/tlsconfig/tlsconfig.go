// Package tlsconfig builds the control plane's TLS configurations from PEM
// files:
//
//	cfg, err := tlsconfig.Server(certFile, keyFile, clientCAFile) // clodex-controlplane; a client CA: mutual TLS
//	cfg, err = tlsconfig.Client(caFile, certFile, keyFile)        // clodexctl and data planes
//
// Both return a nil *tls.Config when no file is given, meaning plaintext.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Server returns the server TLS configuration. certFile and keyFile must be
// given together; clientCAFile, when set, requires and verifies client
// certificates signed by that CA. All empty means plaintext (nil, nil).
func Server(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" {
		if clientCAFile != "" {
			return nil, errors.New("server tls: --client-ca needs --tls-cert and --tls-key")
		}
		return nil, nil
	}
	cert, err := keyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("server tls: %w", err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
	}
	if clientCAFile != "" {
		pool, err := pool(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("server tls: client ca: %w", err)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Client returns the client TLS configuration. caFile verifies the server
// (empty means the system roots, and only makes sense together with a
// client certificate); certFile and keyFile, given together, present a
// client certificate. All empty means plaintext (nil, nil).
func Client(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		p, err := pool(caFile)
		if err != nil {
			return nil, fmt.Errorf("client tls: ca: %w", err)
		}
		cfg.RootCAs = p
	}
	if certFile != "" || keyFile != "" {
		cert, err := keyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client tls: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func keyPair(certFile, keyFile string) (tls.Certificate, error) {
	if certFile == "" || keyFile == "" {
		return tls.Certificate{}, errors.New("--tls-cert and --tls-key must be given together")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load key pair %s, %s: %w", certFile, keyFile, err)
	}
	return cert, nil
}

func pool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificates found", file)
	}
	return p, nil
}
