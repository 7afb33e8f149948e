package controlplane_test

import (
	"crypto/sha256"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// An agent credential scoped to account A may Admit, connect and list its
// accounts for A only: anything for B is PermissionDenied, logged once
// for the credential, and the admin service stays out of its reach.
func TestScopedAgentCredential(t *testing.T) {
	var logs syncBuffer
	srv := controlplanetest.Start(t, &controlplanetest.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	a, b := account.Key("acct-a"), account.Key("acct-b")
	tok, err := bearer.Parse("scoped-agent-token-for-a")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(tok.Reveal()))
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	if _, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{Name: "team-a", Accounts: []string{a}, TokenSha256: sum[:]}); err != nil {
		t.Fatalf("CreateAgentCredential: %v", err)
	}
	bad := sha256.Sum256([]byte(srv.AgentToken.Reveal()))
	if _, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{Name: "x", Accounts: []string{a}, TokenSha256: bad[:]}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("CreateAgentCredential with the fleet's agent token = %v; want InvalidArgument", err)
	}

	conn := srv.Dial(tok, nil)
	adm := controlplanev1.NewAdmissionServiceClient(conn)
	if _, err := adm.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: a}); err != nil {
		t.Errorf("Admit(A) with the credential scoped to A = %v; want admitted", err)
	}
	for range 3 {
		_, err := adm.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: b})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `agent credential "team-a" may use only the accounts `+a) {
			t.Fatalf("Admit(B) = %v; want PermissionDenied naming the credential and its accounts", err)
		}
	}
	creds := controlplanev1.NewCredentialServiceClient(conn)
	if resp, err := creds.ServedAccounts(t.Context(), &controlplanev1.ServedAccountsRequest{}); err != nil || !slices.Equal(resp.GetAccounts(), []string{a}) {
		t.Errorf("ServedAccounts = %v, %v; want [%s]", resp.GetAccounts(), err, a)
	}
	if _, err := creds.GetToken(t.Context(), &controlplanev1.GetTokenRequest{Account: b}); status.Code(err) != codes.FailedPrecondition && status.Code(err) != codes.PermissionDenied {
		t.Errorf("GetToken(B) = %v; want it refused", err)
	}
	stream, err := controlplanev1.NewAgentServiceClient(conn).Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(hello("agent-1", a, b)); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Connect with a hello for A and B = %v; want PermissionDenied", err)
	}
	if _, err := controlplanev1.NewAdminServiceClient(conn).ListAccounts(t.Context(), &controlplanev1.ListAccountsRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ListAccounts with a scoped agent credential = %v; want PermissionDenied", err)
	}
	if n := strings.Count(logs.String(), "agent credential used outside its accounts"); n != 1 {
		t.Errorf("the out-of-scope calls were logged %d times; want once for the credential:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), tok.Reveal()) {
		t.Error("the scoped token reached the log")
	}

	// Removed, the token is refused; the credential survives a restart
	// until then.
	srv.Restart()
	if _, err := controlplanev1.NewAdmissionServiceClient(srv.Dial(tok, nil)).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: a}); err != nil {
		t.Errorf("Admit(A) after a restart = %v; want admitted", err)
	}
	admin = controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	if _, err := admin.RemoveAgentCredential(t.Context(), &controlplanev1.RemoveAgentCredentialRequest{Name: "team-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := controlplanev1.NewAdmissionServiceClient(srv.Dial(tok, nil)).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: a}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Admit after the credential was removed = %v; want Unauthenticated", err)
	}
}
