package tlsconfig_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/tlsconfig"
)

func TestPlaintextWhenNothingGiven(t *testing.T) {
	if cfg, err := tlsconfig.Server("", "", ""); cfg != nil || err != nil {
		t.Errorf("Server() = %v, %v; want nil, nil", cfg, err)
	}
	if cfg, err := tlsconfig.Client("", "", ""); cfg != nil || err != nil {
		t.Errorf("Client() = %v, %v; want nil, nil", cfg, err)
	}
}

func TestServer(t *testing.T) {
	c := controlplanetest.WriteCerts(t)
	cfg, err := tlsconfig.Server(c.ServerCert, c.ServerKey, c.CA)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Certificates) != 1 || cfg.ClientAuth != tls.RequireAndVerifyClientCert || cfg.ClientCAs == nil {
		t.Errorf("Server(mutual) = %+v, want one certificate and required client certificates", cfg)
	}
	cfg, err = tlsconfig.Server(c.ServerCert, c.ServerKey, "")
	if err != nil || cfg.ClientAuth != tls.NoClientCert {
		t.Errorf("Server(no client ca) = %v, %v; want no client certificates", cfg, err)
	}
}

func TestErrors(t *testing.T) {
	c := controlplanetest.WriteCerts(t)
	junk := filepath.Join(t.TempDir(), "junk.pem")
	if err := os.WriteFile(junk, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		err  func() error
		want string
	}{
		{"server cert without key", func() error { _, err := tlsconfig.Server(c.ServerCert, "", ""); return err }, "--tls-cert and --tls-key must be given together"},
		{"server client ca alone", func() error { _, err := tlsconfig.Server("", "", c.CA); return err }, "--client-ca needs --tls-cert and --tls-key"},
		{"server missing file", func() error { _, err := tlsconfig.Server("/nonexistent.pem", c.ServerKey, ""); return err }, "/nonexistent.pem"},
		{"server junk ca", func() error { _, err := tlsconfig.Server(c.ServerCert, c.ServerKey, junk); return err }, "no PEM certificates found"},
		{"client key without cert", func() error { _, err := tlsconfig.Client(c.CA, "", c.ClientKey); return err }, "--tls-cert and --tls-key must be given together"},
		{"client junk ca", func() error { _, err := tlsconfig.Client(junk, "", ""); return err }, "no PEM certificates found"},
		{"client mismatched pair", func() error { _, err := tlsconfig.Client(c.CA, c.ClientCert, c.ServerKey); return err }, "load key pair"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.err(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}
