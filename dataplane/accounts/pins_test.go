package accounts

import (
	"crypto/sha256"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/pool"
)

// heldAmong holds the conversation on account when Route lets it choose
// that account (as the pool's Holder does), and records what is forgotten.
type heldAmong struct {
	account string
	forgot  []string
}

func (h *heldAmong) Holder(_ pool.Partition, _ [][]byte, accounts []string) (string, bool) {
	return h.account, slices.Contains(accounts, h.account)
}

func (h *heldAmong) Forget(p pool.Partition, _ [][]byte) bool {
	h.forgot = append(h.forgot, p.Account)
	return true
}

// A member with accounts runs only on those; a pinned member always on its
// pin (a conversation held elsewhere moves there), refused naming the pin
// and its reset while it is limited, never moved to another account; a
// request asking for an account gets it when its member may use it and the
// data plane serves it, else a 403 naming what it may ask for.
func TestRouteMembersAndPins(t *testing.T) {
	r, c, _ := newRouter(t, "a", "b", "c")
	alice := &Member{Name: "alice", Accounts: []string{"a", "b"}}
	bob := &Member{Name: "bob", Pin: "c"}
	route := func(m *Member, want string, h Heads) (string, error) {
		ctx := t.Context()
		if m != nil {
			ctx = WithMember(ctx, m)
		}
		if want != "" {
			ctx = WithAccount(ctx, want)
		}
		return r.Route(ctx, h, part(), nil)
	}

	got := map[string]int{}
	for range 6 {
		id, err := route(alice, "", noHeads{})
		if err != nil {
			t.Fatal(err)
		}
		got[id]++
	}
	if got["a"] != 3 || got["b"] != 3 {
		t.Errorf("alice's six new conversations = %v; want a and b three times each, never c", got)
	}
	// alice's conversation held on c (before she had accounts) goes to one
	// of hers; it is not kept on c.
	if id, err := route(alice, "", &heldAmong{account: "c"}); err != nil || id == "c" {
		t.Errorf("alice with a head on c = %q, %v; want a or b", id, err)
	}

	h := &heldAmong{account: "a"}
	if id, err := route(bob, "", h); err != nil || id != "c" || !slices.Equal(h.forgot, []string{"a"}) {
		t.Errorf("bob with a head on a = %q, %v (forgot %v); want c, its head on a dropped", id, err, h.forgot)
	}
	reset := c.t.Add(90 * time.Minute)
	r.limited("c", reset)
	_, err := route(bob, "", noHeads{})
	var cl *ChosenLimitedError
	if !errors.As(err, &cl) || cl.Account != "c" || !cl.Pinned || !cl.ResetsAt.Equal(reset) || cl.ResetsIn != 90*time.Minute {
		t.Fatalf("bob while c is limited = %v; want a ChosenLimitedError for c resetting in 90m", err)
	}
	msg, at, in := cl.Limited()
	if want := "Member bob is pinned to account c, which is at its usage limit; it resets at 2026-12-01T13:30:00Z (in 1h30m)"; !strings.HasPrefix(msg, want) || !at.Equal(reset) || in != 90*time.Minute {
		t.Errorf("Limited() = %q, %v, %v; want %q...", msg, at, in, want)
	}
	// The request may ask for another account than the pin.
	if id, err := route(bob, "b", noHeads{}); err != nil || id != "b" {
		t.Errorf("bob asking for b = %q, %v; want b", id, err)
	}
	if id, err := route(alice, "b", noHeads{}); err != nil || id != "b" {
		t.Errorf("alice asking for b = %q, %v; want b", id, err)
	}
	if _, err := route(nil, "c", noHeads{}); !errors.As(err, &cl) || cl.Pinned {
		t.Errorf("a request asking for the limited c = %v; want a ChosenLimitedError, not pinned", err)
	}

	var na *NotAllowedError
	for _, tt := range []struct {
		name string
		m    *Member
		want string
		msg  string
	}{
		{"not the member's", alice, "c", "Member alice may not use account c, which this request asks for (X-Clodex-Account); the accounts it may ask for here are: a, b"},
		{"not served", nil, "d", "Account d, which this request asks for (X-Clodex-Account), is not served by this data plane; the accounts it may ask for here are: a, b, c"},
		{"pin not served", &Member{Name: "carol", Pin: "z"}, "", "Member carol is pinned to account z, which this data plane does not serve"},
		{"none served", &Member{Name: "dave", Accounts: []string{"y", "z"}}, "", "This data plane serves none of member dave's accounts (y, z)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := route(tt.m, tt.want, noHeads{})
			if !errors.As(err, &na) || !strings.HasPrefix(na.NotAllowed(), tt.msg) {
				t.Errorf("Route = %v; want a NotAllowedError saying %q", err, tt.msg)
			}
		})
	}
}

// The member list answers a key by its digest: a key no member holds is
// unknown, a list not yet pushed is not ready, and a new push replaces
// the old list whole.
func TestMembersLookup(t *testing.T) {
	l := NewMembers()
	if m, ready := l.Lookup("clx_any"); m != nil || ready {
		t.Errorf("Lookup before a push = %v, %v; want not ready", m, ready)
	}
	alice := MemberKey{Member: Member{Name: "alice", RatePerMinute: 3}, Digest: sha("clx_alice")}
	bob := MemberKey{Member: Member{Name: "bob"}, Digest: sha("clx_bob")}
	l.Set([]MemberKey{alice, bob})
	if m, ready := l.Lookup("clx_alice"); !ready || m == nil || m.Name != "alice" || m.RatePerMinute != 3 {
		t.Errorf("Lookup(alice's key) = %+v, %v; want alice", m, ready)
	}
	if m, ready := l.Lookup("clx_alice "); !ready || m != nil {
		t.Errorf("Lookup of another key = %+v, %v; want none", m, ready)
	}
	l.Set([]MemberKey{bob})
	if m, _ := l.Lookup("clx_alice"); m != nil || l.Len() != 1 {
		t.Errorf("Lookup(alice's key) after her removal = %+v (%d members); want none", m, l.Len())
	}
}

func sha(s string) [32]byte { return sha256.Sum256([]byte(s)) }
