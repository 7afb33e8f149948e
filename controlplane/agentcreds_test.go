package controlplane_test

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/codexsim/simauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// A scoped credential for an account the credential broker holds no
// sign-in for is refused, naming the account and how to sign it in; once
// the account is imported the same request succeeds. Without a broker
// nothing is checked (data planes bring their own auth.json).
func TestAgentCredentialNeedsASignIn(t *testing.T) {
	srv := controlplanetest.Start(t, &controlplanetest.Options{Broker: true})
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	a, nosuch := account.Key("acct-a"), account.Key("nosuch")
	sum := sha256.Sum256([]byte("scoped-token-of-team-a"))
	req := &controlplanev1.CreateAgentCredentialRequest{Name: "team-a", Accounts: []string{a, nosuch}, TokenSha256: sum[:]}

	_, err := admin.CreateAgentCredential(t.Context(), req)
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, "holds no sign-in for "+a+", "+nosuch) ||
		!strings.Contains(msg, "clodexctl account import --codex-auth FILE") {
		t.Fatalf("CreateAgentCredential for accounts without a sign-in = %v; want FailedPrecondition naming both and how to import them", err)
	}
	if list, err := admin.ListAgentCredentials(t.Context(), &controlplanev1.ListAgentCredentialsRequest{}); err != nil || len(list.GetCredentials()) != 0 {
		t.Errorf("credentials after the refusal = %v, %v; want none stored", list.GetCredentials(), err)
	}

	idp, err := simauth.New(simauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"acct-a", "nosuch"} {
		toks, err := idp.Issue(id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ImportLogin(t.Context(), &controlplanev1.ImportLoginRequest{
			AccessToken: toks.AccessToken, RefreshToken: toks.RefreshToken, IdToken: toks.IDToken, AccountId: id,
		}); err != nil {
			t.Fatalf("ImportLogin %s: %v", id, err)
		}
	}
	if _, err := admin.CreateAgentCredential(t.Context(), req); err != nil {
		t.Errorf("CreateAgentCredential once both are signed in = %v", err)
	}

	plain := controlplanetest.Start(t, nil)
	padmin := controlplanev1.NewAdminServiceClient(plain.Dial(plain.AdminToken, nil))
	if _, err := padmin.CreateAgentCredential(t.Context(), req); err != nil {
		t.Errorf("CreateAgentCredential without a broker = %v; want it stored (nothing to check)", err)
	}
}

// While Redis is down (the first failed calls, then the breaker open) the
// agent-credential RPCs answer Unavailable with the store's cause and what
// to do, never Internal, with and without the credential broker.
func TestAgentCredentialStoreDown(t *testing.T) {
	rs := redistest.Start(t)
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	withBroker := controlplanetest.Start(t, &controlplanetest.Options{RedisURL: rs.URL, RedisPrefix: "b:", Broker: true, Logger: log})
	without := controlplanetest.Start(t, &controlplanetest.Options{RedisURL: rs.URL, RedisPrefix: "p:", Logger: log})
	rs.Kill()

	for _, srv := range []*controlplanetest.Server{withBroker, without} {
		admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
		health := healthpb.NewHealthClient(srv.Dial(srv.AdminToken, nil))
		// Before the breaker opens, each call fails on Redis itself; then
		// the breaker answers without calling it.
		for i := range 6 {
			sum := sha256.Sum256(fmt.Appendf(nil, "token-%d", i))
			_, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{
				Name: fmt.Sprint("team-", i), Accounts: []string{account.Key("acct-a")}, TokenSha256: sum[:]})
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.Unavailable || !strings.Contains(msg, "the store did not answer (") ||
				!strings.Contains(msg, "redis") || !strings.Contains(msg, "run the command again once it answers") {
				t.Errorf("CreateAgentCredential %d with Redis down = %v; want Unavailable naming the store's cause and what to do", i, err)
			}
		}
		waitHealth(t, health, healthpb.HealthCheckResponse_NOT_SERVING)
		if _, err := admin.ListAgentCredentials(t.Context(), &controlplanev1.ListAgentCredentialsRequest{}); status.Code(err) != codes.Unavailable {
			t.Errorf("ListAgentCredentials with Redis down = %v; want Unavailable", err)
		}
		if _, err := admin.RemoveAgentCredential(t.Context(), &controlplanev1.RemoveAgentCredentialRequest{Name: "team-0"}); status.Code(err) != codes.Unavailable {
			t.Errorf("RemoveAgentCredential with Redis down = %v; want Unavailable", err)
		}
	}
	if strings.Contains(logs.String(), "internal error") || strings.Contains(logs.String(), `msg="rpc failed" `) {
		t.Errorf("a store failure was logged as an unexpected error:\n%s", logs.String())
	}
}

// A scoped credential created through one replica works on another at
// once: a token no credential matches makes the replica read the store
// again (at most four times a second), so a data plane started right after
// `clodexctl agent create` is not refused for up to a fleet tick.
func TestAgentCredentialWorksOnEveryReplicaAtOnce(t *testing.T) {
	rs := redistest.Start(t)
	a := controlplanetest.Start(t, &controlplanetest.Options{RedisURL: rs.URL, Replica: "a", FleetTick: time.Hour})
	b := controlplanetest.Start(t, &controlplanetest.Options{RedisURL: rs.URL, Replica: "b", FleetTick: time.Hour, Tokens: a})
	tok, err := bearer.Parse("scoped-token-of-host-1")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(tok.Reveal()))
	key := account.Key("acct-a")
	admin := controlplanev1.NewAdminServiceClient(a.Dial(a.AdminToken, nil))
	if _, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{Name: "host-1", Accounts: []string{key}, TokenSha256: sum[:]}); err != nil {
		t.Fatal(err)
	}
	creds := controlplanev1.NewCredentialServiceClient(b.Dial(tok, nil))
	resp, err := creds.ServedAccounts(t.Context(), &controlplanev1.ServedAccountsRequest{})
	if err != nil || len(resp.GetAccounts()) != 1 || resp.GetAccounts()[0] != key {
		t.Errorf("ServedAccounts on the other replica right after the credential was created = %v, %v; want its account", resp.GetAccounts(), err)
	}
	// A token no credential matches is still refused.
	stranger := controlplanev1.NewCredentialServiceClient(b.Dial(tokOf(t, "not-a-credential"), nil))
	if _, err := stranger.ServedAccounts(t.Context(), &controlplanev1.ServedAccountsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("ServedAccounts with an unknown token = %v; want Unauthenticated", err)
	}
}

func tokOf(t *testing.T, s string) bearer.Token {
	t.Helper()
	tk, err := bearer.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}
