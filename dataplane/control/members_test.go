package control_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

func createMember(t *testing.T, admin controlplanev1.AdminServiceClient, name, key string, rate int32, accts ...string) {
	t.Helper()
	sum := sha256.Sum256([]byte(key))
	if _, err := admin.CreateMember(context.Background(), &controlplanev1.CreateMemberRequest{Name: name, KeySha256: sum[:], RatePerMinute: rate, Accounts: accts}); err != nil {
		t.Fatalf("CreateMember(%s): %v", name, err)
	}
}

// The member list the control plane pushes reaches Config.Members: empty
// after the hello, then every creation and removal; the keys it names are
// found by their digest.
func TestMemberPushes(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	admin := adminClient(srv)
	ms := accounts.NewMembers()
	cfg := agentConfig(srv, clk, newRecorder(), "members-1-aaaa", keyA)
	cfg.Members = ms
	run(t, cfg, newRecorder())
	eventually(t, "the first member push", ms.Ready)
	createMember(t, admin, "alice", "clx_alice", 3, keyA)
	eventually(t, "alice pushed", func() bool { m, _ := ms.Lookup("clx_alice"); return m != nil })
	m, _ := ms.Lookup("clx_alice")
	if m.Name != "alice" || m.RatePerMinute != 3 || len(m.Accounts) != 1 || m.Accounts[0] != keyA {
		t.Errorf("alice as pushed = %+v; want rate 3 on %s", m, keyA)
	}
	if m, ready := ms.Lookup("clx_bob"); m != nil || !ready {
		t.Errorf("an unknown key = %+v, %v; want none", m, ready)
	}
	if _, err := admin.RemoveMember(context.Background(), &controlplanev1.RemoveMemberRequest{Name: "alice"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "alice removed", func() bool { m, _ := ms.Lookup("clx_alice"); return m == nil })
}

// A member's cap refuses central admissions once spent, naming the member
// (RefusedError.Member); another member is admitted meanwhile. With the
// control plane unreachable the local fallback applies the cap too.
func TestAdmitMemberCap(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	srv.Register(keyA)
	admin := adminClient(srv)
	createMember(t, admin, "alice", "clx_alice", 3)
	createMember(t, admin, "bob", "clx_bob", 0)
	alice := &accounts.Member{Name: "alice", RatePerMinute: 3}
	bob := &accounts.Member{Name: "bob"}

	for name, c := range map[string]*control.Client{
		"central": newClient(t, control.Config{Target: srv.Addr, Token: srv.AgentToken}, clk, &noticeLog{}),
		"local": newClient(t, control.Config{Target: closedAddr(t), Token: srv.AgentToken,
			Fallback: pacing.Policy{RatePerMinute: 600, Burst: 100, Budget: pacing.DefaultBudget()}}, clk, &noticeLog{}),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := accounts.WithMember(t.Context(), alice)
			for i := range 3 {
				if err := c.Admit(ctx, keyA); err != nil {
					t.Fatalf("alice's admission %d = %v, want admitted", i+1, err)
				}
			}
			err := c.Admit(ctx, keyA)
			var re *control.RefusedError
			if !errors.As(err, &re) || re.Member != "alice" || re.MemberRate != 3 || re.Local != (name == "local") {
				t.Fatalf("alice's fourth = %#v, want refused by her cap (local %v)", err, name == "local")
			}
			if member, rate := re.MemberCap(); member != "alice" || rate != 3 {
				t.Errorf("MemberCap() = %q, %d", member, rate)
			}
			if err := c.Admit(accounts.WithMember(t.Context(), bob), keyA); err != nil {
				t.Errorf("bob in the same instant = %v, want admitted", err)
			}
		})
	}
}
