package controlplane_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/tlsconfig"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

func TestMutualTLS(t *testing.T) {
	certs := controlplanetest.WriteCerts(t)
	serverTLS, err := tlsconfig.Server(certs.ServerCert, certs.ServerKey, certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	srv := controlplanetest.Start(t, &controlplanetest.Options{TLS: serverTLS})

	admit := func(t *testing.T, ca, cert, key string) error {
		t.Helper()
		cfg, err := tlsconfig.Client(ca, cert, key)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err = controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AdminToken, cfg)).Admit(ctx, &controlplanev1.AdmitRequest{Account: key})
		return err
	}
	t.Run("client certificate", func(t *testing.T) {
		if err := admit(t, certs.CA, certs.ClientCert, certs.ClientKey); err != nil {
			t.Errorf("Admit over mutual TLS: %v", err)
		}
	})
	t.Run("no client certificate", func(t *testing.T) {
		if err := admit(t, certs.CA, "", ""); status.Code(err) != codes.Unavailable {
			t.Errorf("Admit without a client certificate: %v, want Unavailable", err)
		}
	})
	t.Run("wrong CA", func(t *testing.T) {
		if err := admit(t, certs.OtherCA, certs.ClientCert, certs.ClientKey); status.Code(err) != codes.Unavailable {
			t.Errorf("Admit trusting another CA: %v, want Unavailable", err)
		}
	})
	t.Run("plaintext client", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AdminToken, nil)).Admit(ctx, &controlplanev1.AdmitRequest{Account: key})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("plaintext Admit to a TLS server: %v, want Unavailable", err)
		}
	})
}

func TestServerTLSWithoutClientCA(t *testing.T) {
	certs := controlplanetest.WriteCerts(t)
	serverTLS, err := tlsconfig.Server(certs.ServerCert, certs.ServerKey, "")
	if err != nil {
		t.Fatal(err)
	}
	srv := controlplanetest.Start(t, &controlplanetest.Options{TLS: serverTLS})
	cfg, err := tlsconfig.Client(certs.CA, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AdminToken, cfg)).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key}); err != nil {
		t.Errorf("Admit over TLS: %v", err)
	}
	// The token is still required over TLS.
	_, err = controlplanev1.NewAdmissionServiceClient(srv.Dial(mustToken(t, "wrong"), cfg)).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("Admit over TLS with a wrong token: %v, want Unauthenticated", err)
	}
}
