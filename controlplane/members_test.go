package controlplane_test

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// memberKeyDigest is the digest of a member's test key.
func memberKeyDigest(name string) []byte {
	sum := sha256.Sum256([]byte("clx_key-of-" + name))
	return sum[:]
}

// memberHello is a hello of an agent that takes member pushes.
func memberHello(id string, accounts ...string) *controlplanev1.ConnectRequest {
	return &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Hello{Hello: &controlplanev1.AgentHello{
		AgentId: id, Host: "h", Version: "v", CapabilityVersion: int32(controlplanev1.CapabilityVersion_CAPABILITY_VERSION_MEMBERS), Accounts: accounts,
	}}}
}

// recvMembers reads st until a member push and returns its members as
// "name accounts pin rate digest-ok" lines; policy pushes are skipped.
func recvMembers(t *testing.T, st rawStream) []string {
	t.Helper()
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("Recv: %v; want a member push", err)
		}
		if p := m.GetMembers(); p != nil {
			out := []string{}
			for _, pm := range p.GetMembers() {
				out = append(out, fmt.Sprintf("%s %v %q %d %v", pm.GetName(), pm.GetAccounts(), pm.GetPin(), pm.GetRatePerMinute(),
					string(pm.GetKeySha256()) == string(memberKeyDigest(pm.GetName()))))
			}
			return out
		}
	}
}

// An agent of CAPABILITY_VERSION_MEMBERS gets the member list after its
// hello and again after every change, with each member's key digest,
// accounts, pin and cap (never a key); an older agent gets none.
func TestMembersPushed(t *testing.T) {
	srv := controlplanetest.Start(t, &controlplanetest.Options{FleetTick: time.Hour})
	a, b := account.Key("acct-a"), account.Key("acct-b")
	st := connect(t, srv, memberHello("agent-new", a))
	if got := recvMembers(t, st); len(got) != 0 {
		t.Errorf("members after the hello = %v, want none", got)
	}
	old := connect(t, srv, hello("agent-old", a))
	recvPolicy(t, old)

	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	if _, err := admin.CreateMember(t.Context(), &controlplanev1.CreateMemberRequest{Name: "alice", KeySha256: memberKeyDigest("alice"),
		Accounts: []string{b, a}, Pin: a, RatePerMinute: 3}); err != nil {
		t.Fatalf("CreateMember: %v", err)
	}
	want := []string{fmt.Sprintf("alice [%s %s] %q 3 true", min(a, b), max(a, b), a)}
	if got := recvMembers(t, st); !slices.Equal(got, want) {
		t.Errorf("members after create = %v, want %v", got, want)
	}
	if _, err := admin.CreateMember(t.Context(), &controlplanev1.CreateMemberRequest{Name: "bob", KeySha256: memberKeyDigest("bob")}); err != nil {
		t.Fatalf("CreateMember: %v", err)
	}
	want = append(want, `bob [] "" 0 true`)
	if got := recvMembers(t, st); !slices.Equal(got, want) {
		t.Errorf("members after the second create = %v, want %v", got, want)
	}
	if _, err := admin.RemoveMember(t.Context(), &controlplanev1.RemoveMemberRequest{Name: "alice"}); err != nil {
		t.Fatalf("RemoveMember: %v", err)
	}
	if got := recvMembers(t, st); !slices.Equal(got, want[1:]) {
		t.Errorf("members after remove = %v, want %v", got, want[1:])
	}
	list, err := admin.ListMembers(t.Context(), &controlplanev1.ListMembersRequest{})
	if err != nil || len(list.GetMembers()) != 1 || list.GetMembers()[0].GetName() != "bob" || list.GetMembers()[0].GetCreatedUnixMs() == 0 {
		t.Errorf("ListMembers = %v, %v; want bob with its creation time", list, err)
	}
	// The older agent was pushed no member list: its next message is the
	// policy a set-rate pushes.
	if _, err := admin.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: a, RatePerMinute: 30, Burst: proto.Int32(5)}); err != nil {
		t.Fatal(err)
	}
	m, err := old.Recv()
	if err != nil || m.GetPolicy().GetRatePerMinute() != 30 {
		t.Errorf("the older agent's next message = %v, %v; want the policy push", m, err)
	}
}

// Every bad CreateMember is InvalidArgument naming what is wrong and what
// is allowed; a second member with the same key is refused; removing an
// unknown member is NotFound.
func TestCreateMemberBadInput(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	a := account.Key("acct-a")
	many := make([]string, 101)
	for i := range many {
		many[i] = fmt.Sprintf("acct_%016x", i)
	}
	for _, tt := range []struct {
		name string
		req  *controlplanev1.CreateMemberRequest
		want string
	}{
		{"bad name", &controlplanev1.CreateMemberRequest{Name: "al ice", KeySha256: memberKeyDigest("x")}, `member name "al ice" is invalid; want 1..64 letters, digits`},
		{"no digest", &controlplanev1.CreateMemberRequest{Name: "alice", KeySha256: []byte("short")}, "the key digest is 5 bytes; want 32"},
		{"bad account", &controlplanev1.CreateMemberRequest{Name: "alice", KeySha256: memberKeyDigest("x"), Accounts: []string{"acct-a"}}, `accounts[0] "acct-a" is not an account key`},
		{"too many accounts", &controlplanev1.CreateMemberRequest{Name: "alice", KeySha256: memberKeyDigest("x"), Accounts: many}, "accounts lists 101 keys; allowed at most 100"},
		{"pin outside", &controlplanev1.CreateMemberRequest{Name: "alice", KeySha256: memberKeyDigest("x"), Accounts: []string{a}, Pin: many[0]}, "is not one of the member's accounts"},
		{"rate", &controlplanev1.CreateMemberRequest{Name: "alice", KeySha256: memberKeyDigest("x"), RatePerMinute: 601}, "rate_per_minute 601 is out of range; allowed 0..600"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := admin.CreateMember(t.Context(), tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Errorf("CreateMember = %v, want InvalidArgument containing %q", err, tt.want)
			}
		})
	}
	if _, err := admin.CreateMember(t.Context(), &controlplanev1.CreateMemberRequest{Name: "alice", KeySha256: memberKeyDigest("alice")}); err != nil {
		t.Fatal(err)
	}
	_, err := admin.CreateMember(t.Context(), &controlplanev1.CreateMemberRequest{Name: "bob", KeySha256: memberKeyDigest("alice")})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `the key is member "alice"'s`) {
		t.Errorf("a second member with alice's key = %v, want InvalidArgument naming alice", err)
	}
	if _, err := admin.RemoveMember(t.Context(), &controlplanev1.RemoveMemberRequest{Name: "carol"}); status.Code(err) != codes.NotFound {
		t.Errorf("RemoveMember of an unknown member = %v, want NotFound", err)
	}
	// The member RPCs are the admin's: the agent token is refused.
	agentAdmin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AgentToken, nil))
	if _, err := agentAdmin.ListMembers(t.Context(), &controlplanev1.ListMembersRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ListMembers with the agent token = %v, want PermissionDenied", err)
	}
}

// A member's cap is taken before the account's bucket: alice at 3 a
// minute gets three of six admissions and three refusals marked
// member_limited; bob, without a cap, is admitted in the same instant.
// When the account refuses, alice's token comes back.
func TestAdmitMemberCap(t *testing.T) {
	for _, redis := range []bool{false, true} {
		t.Run(map[bool]string{false: "memory", true: "redis"}[redis], func(t *testing.T) {
			opts := &controlplanetest.Options{Now: newClock().Now}
			if redis {
				opts.RedisURL, opts.RedisPrefix, opts.RedisTimeout = redistest.Start(t).URL, "cap:", 5*time.Second
			}
			srv := controlplanetest.Start(t, opts)
			a, tight := account.Key("acct-a"), account.Key("acct-tight")
			srv.Register(a, tight)
			admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
			for _, m := range []*controlplanev1.CreateMemberRequest{
				{Name: "alice", KeySha256: memberKeyDigest("alice"), RatePerMinute: 3},
				{Name: "bob", KeySha256: memberKeyDigest("bob")},
				{Name: "carol", KeySha256: memberKeyDigest("carol"), RatePerMinute: 5},
			} {
				if _, err := admin.CreateMember(t.Context(), m); err != nil {
					t.Fatal(err)
				}
			}
			// One token a burst, 3 a minute: the account's second
			// admission is refused.
			if _, err := admin.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: tight, RatePerMinute: 3, Burst: proto.Int32(1)}); err != nil {
				t.Fatal(err)
			}
			adm := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
			admit := func(member, acct string) string {
				t.Helper()
				r, err := adm.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: acct, Member: member})
				if err != nil {
					t.Fatalf("Admit(%s, %s): %v", member, acct, err)
				}
				s := strings.TrimPrefix(r.GetDecision().String(), "DECISION_")
				if r.GetMemberLimited() {
					s += fmt.Sprintf(" member %ds", r.GetRetryAfterMs()/1000)
				}
				return s
			}
			var got []string
			for range 6 {
				got = append(got, admit("alice", a))
			}
			want := []string{"ADMIT", "ADMIT", "ADMIT", "REFUSE member 4s", "REFUSE member 4s", "REFUSE member 4s"}
			if !slices.Equal(got, want) {
				t.Errorf("alice's six = %v, want %v", got, want)
			}
			if got := admit("bob", a); got != "ADMIT" {
				t.Errorf("bob in the same instant = %s, want ADMIT", got)
			}
			if got := admit("nobody", a); got != "ADMIT" {
				t.Errorf("an unknown member = %s, want ADMIT (no cap)", got)
			}
			// carol (5) spends one token on the tight account, then is
			// refused by the account, not by her cap: that token comes
			// back, so four more are hers on another account, not three.
			got = []string{admit("carol", tight), admit("carol", tight)}
			for range 5 {
				got = append(got, admit("carol", a))
			}
			want = []string{"ADMIT", "REFUSE", "ADMIT", "ADMIT", "ADMIT", "ADMIT", "REFUSE member 4s"}
			if !slices.Equal(got, want) {
				t.Errorf("carol = %v, want %v", got, want)
			}
			_, err := adm.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: a, Member: "no spaces allowed"})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "member: member name") {
				t.Errorf("Admit with a bad member name = %v, want InvalidArgument", err)
			}
		})
	}
}

// Over Redis, a member removed through one replica leaves the list the
// other replica pushes, on the store's notice: the other replica's own
// reload is an hour away. The delay is measured and printed.
func TestMemberRemovalReachesEveryReplica(t *testing.T) {
	rs := redistest.Start(t)
	base := controlplanetest.Options{RedisURL: rs.URL, RedisPrefix: "members:", FleetTick: time.Hour, RedisTimeout: 5 * time.Second}
	optsA, optsB := base, base
	optsA.Replica, optsB.Replica = "cp-a", "cp-b"
	a := controlplanetest.Start(t, &optsA)
	optsB.Tokens = a
	b := controlplanetest.Start(t, &optsB)
	waitSubscribers(t, rs, "members:agentcreds-changed", 2)

	st := connect(t, b, memberHello("agent-on-b", account.Key("acct-a")))
	if got := recvMembers(t, st); len(got) != 0 {
		t.Fatalf("members = %v, want none yet", got)
	}
	admin := controlplanev1.NewAdminServiceClient(a.Dial(a.AdminToken, nil))
	if _, err := admin.CreateMember(t.Context(), &controlplanev1.CreateMemberRequest{Name: "alice", KeySha256: memberKeyDigest("alice")}); err != nil {
		t.Fatal(err)
	}
	if got := recvMembers(t, st); !slices.Equal(got, []string{`alice [] "" 0 true`}) {
		t.Fatalf("members on B after create on A = %v, want alice", got)
	}
	start := time.Now()
	if _, err := admin.RemoveMember(t.Context(), &controlplanev1.RemoveMemberRequest{Name: "alice"}); err != nil {
		t.Fatal(err)
	}
	if got := recvMembers(t, st); len(got) != 0 {
		t.Errorf("members on B after the removal on A = %v, want none", got)
	}
	t.Logf("a member removed through replica A left replica B's push after %v", time.Since(start).Round(time.Microsecond))
}
