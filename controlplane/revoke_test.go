package controlplane_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// createScoped creates the scoped agent credential name for accounts
// through admin and returns its token.
func createScoped(t *testing.T, srv *controlplanetest.Server, name string, accounts ...string) bearer.Token {
	t.Helper()
	tok, err := bearer.Parse("scoped-token-of-" + name)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(tok.Reveal()))
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	if _, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{Name: name, Accounts: accounts, TokenSha256: sum[:]}); err != nil {
		t.Fatalf("CreateAgentCredential: %v", err)
	}
	return tok
}

// scopedStream connects an agent stream to srv with tok, says hello for
// accounts, and waits until the server accepted it (its headers).
func scopedStream(t *testing.T, srv *controlplanetest.Server, tok bearer.Token, id string, accounts ...string) rawStream {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	st, err := controlplanev1.NewAgentServiceClient(srv.Dial(tok, nil)).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(hello(id, accounts...)); err != nil {
		t.Fatal(err)
	}
	if md, err := st.Header(); err != nil || md == nil {
		_, rerr := st.Recv()
		t.Fatalf("the stream was not accepted: %v %v", err, rerr)
	}
	return st
}

// recvRevoked reads st until it ends and requires the revocation: an
// AgentClose naming the credential, then Unauthenticated with an
// ErrorInfo AGENT_REFUSAL_REVOKED.
func recvRevoked(t *testing.T, st rawStream, name string) {
	t.Helper()
	closed := ""
	for {
		m, err := st.Recv()
		if err == nil {
			if c := m.GetClose(); c != nil {
				closed = c.GetReason()
			}
			continue
		}
		want := `agent credential "` + name + `" was revoked (clodexctl agent remove)`
		if closed != want {
			t.Errorf("close reason = %q, want %q", closed, want)
		}
		checkRevoked(t, "the stream's end", err, name)
		return
	}
}

// Removing a scoped agent credential closes its agent streams at once,
// with the reason and a status that says it was revoked, and refuses its
// calls; the fleet's agent token and the other credentials keep working.
func TestRemoveAgentCredentialClosesItsStreams(t *testing.T) {
	srv := controlplanetest.Start(t, &controlplanetest.Options{FleetTick: time.Hour})
	a, b := account.Key("acct-a"), account.Key("acct-b")
	tokA := createScoped(t, srv, "team-a", a)
	tokB := createScoped(t, srv, "team-b", b)
	stA := scopedStream(t, srv, tokA, "agent-a", a)
	stB := scopedStream(t, srv, tokB, "agent-b", b)
	fleet := scopedStream(t, srv, srv.AgentToken, "agent-fleet", a)
	recvPolicy(t, stB)
	recvPolicy(t, fleet)

	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	start := time.Now()
	if _, err := admin.RemoveAgentCredential(t.Context(), &controlplanev1.RemoveAgentCredentialRequest{Name: "team-a"}); err != nil {
		t.Fatal(err)
	}
	recvRevoked(t, stA, "team-a")
	t.Logf("revocation on the same replica: the stream ended %v after RemoveAgentCredential was sent", time.Since(start).Round(time.Microsecond))
	_, err := controlplanev1.NewAdmissionServiceClient(srv.Dial(tokA, nil)).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: a})
	checkRevoked(t, "Admit with the revoked token", err, "team-a")
	if _, err := controlplanev1.NewAdmissionServiceClient(srv.Dial(tokB, nil)).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: b}); err != nil {
		t.Errorf("Admit with another credential = %v, want it answered", err)
	}
	agents, err := admin.ListAgents(t.Context(), &controlplanev1.ListAgentsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ag := range agents.GetAgents() {
		ids = append(ids, ag.GetId())
	}
	if len(ids) != 2 || ids[0] != "agent-b" || ids[1] != "agent-fleet" {
		t.Errorf("agents after the revocation = %v, want agent-b and agent-fleet", ids)
	}

	// A credential replaced under its name with other accounts closes its
	// streams with Unavailable: the agent reconnects and is checked again.
	sumB := sha256.Sum256([]byte(tokB.Reveal()))
	if _, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{Name: "team-b", Accounts: []string{a}, TokenSha256: sumB[:]}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := stB.Recv()
		if err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Errorf("a replaced credential's stream ended with %v, want Unavailable", err)
			}
			break
		}
	}
}

// Over Redis, a credential removed through one replica closes its stream
// on the other and is refused there, on the store's notice: the other
// replica's own reload is an hour away. The delay is measured and
// printed.
func TestRevocationReachesEveryReplica(t *testing.T) {
	rs := redistest.Start(t)
	base := controlplanetest.Options{RedisURL: rs.URL, RedisPrefix: "revoke:", FleetTick: time.Hour, RedisTimeout: 5 * time.Second}
	optsA, optsB := base, base
	optsA.Replica, optsB.Replica = "cp-a", "cp-b"
	a := controlplanetest.Start(t, &optsA)
	optsB.Tokens = a
	b := controlplanetest.Start(t, &optsB)
	waitSubscribers(t, rs, "revoke:agentcreds-changed", 2)

	acct := account.Key("acct-a")
	tok := createScoped(t, a, "team-a", acct)
	// B learns the new credential by the same notice.
	var st rawStream
	for i := 0; ; i++ {
		conn := b.Dial(tok, nil)
		_, err := controlplanev1.NewAdmissionServiceClient(conn).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: acct})
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unauthenticated || i == 3000 {
			t.Fatalf("Admit on replica B with the new credential = %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	st = scopedStream(t, b, tok, "agent-on-b", acct)
	recvPolicy(t, st)

	admin := controlplanev1.NewAdminServiceClient(a.Dial(a.AdminToken, nil))
	start := time.Now()
	if _, err := admin.RemoveAgentCredential(t.Context(), &controlplanev1.RemoveAgentCredentialRequest{Name: "team-a"}); err != nil {
		t.Fatal(err)
	}
	recvRevoked(t, st, "team-a")
	t.Logf("revocation through replica A closed the stream on replica B after %v", time.Since(start).Round(time.Microsecond))
	_, err := controlplanev1.NewAdmissionServiceClient(b.Dial(tok, nil)).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: acct})
	checkRevoked(t, "Admit on replica B with the revoked token", err, "team-a")
}

// checkRevoked requires err to be the refusal of the revoked credential
// name: Unauthenticated saying so, with its ErrorInfo.
func checkRevoked(t *testing.T, what string, err error, name string) {
	t.Helper()
	s := status.Convert(err)
	want := `agent credential "` + name + `" was revoked (clodexctl agent remove); an operator must issue this data plane a new agent credential`
	if s.Code() != codes.Unauthenticated || s.Message() != want {
		t.Errorf("%s = %v, want Unauthenticated %q", what, err, want)
	}
	var info *errdetails.ErrorInfo
	for _, d := range s.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info.GetReason() != "AGENT_REFUSAL_REVOKED" || info.GetMetadata()["credential"] != name {
		t.Errorf("%s: details %v, want an ErrorInfo AGENT_REFUSAL_REVOKED naming %s", what, s.Details(), name)
	}
}
