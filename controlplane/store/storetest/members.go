package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
)

// memberCap: a member's bucket is its rate a minute with a burst of the
// same, shared by every handle of the store (fleet-wide), separate per
// member; a refund gives a token back; a new rate applies at once.
func memberCap(t *testing.T, k Kind) {
	clk := NewClock(t0)
	s := k.Open(t, clk.Now, nil)
	peer := k.Peer(t, s, clk.Now)
	p := store.MemberPolicy(3, pacing.DefaultBudget())
	take := func(s Store, member string) pacing.Decision {
		t.Helper()
		d, err := s.AdmitMember(t.Context(), member, p, clk.Now())
		if err != nil {
			t.Fatalf("AdmitMember(%s): %v", member, err)
		}
		return d
	}
	describe := func(d pacing.Decision) string { return Describe(store.Admission{Decision: d}) }

	// Six at once through two handles: the first three now, then refused
	// with the default budget's hint (a slot needs 20 s, past the wait
	// bound of 4833 ms).
	var got []string
	var ids []uint64
	for i := range 6 {
		h := s
		if i%2 == 1 {
			h = peer
		}
		d := take(h, "alice")
		got = append(got, describe(d))
		if d.Debited {
			ids = append(ids, d.ID)
		}
	}
	want := []string{"now", "now", "now", "refuse 4s deficit 20000ms", "refuse 4s deficit 20000ms", "refuse 4s deficit 20000ms"}
	if !slices.Equal(got, want) {
		t.Errorf("alice's six at once = %v, want %v", got, want)
	}
	if d := take(s, "bob"); describe(d) != "now" {
		t.Errorf("bob in the same instant = %s, want now (members do not share a bucket)", describe(d))
	}
	// A refund gives one token back: one more starts now.
	if err := s.RefundMember(t.Context(), "alice", ids[len(ids)-1], clk.Now()); err != nil {
		t.Fatalf("RefundMember: %v", err)
	}
	if d := take(peer, "alice"); describe(d) != "now" {
		t.Errorf("after a refund = %s, want now", describe(d))
	}
	// 20 s later one token has come back.
	clk.Set(t0.Add(20 * time.Second))
	if got := fmt.Sprint(describe(take(s, "alice")), " ", describe(take(s, "alice"))); got != "now refuse 4s deficit 20000ms" {
		t.Errorf("20s later = %s, want one now and one refused", got)
	}
	// A higher cap applies at once, keeping the tokens (none): a slot of
	// 60/min is a second away, within the wait bound.
	p = store.MemberPolicy(60, pacing.DefaultBudget())
	if d := take(s, "alice"); describe(d) != "wait 1000ms" {
		t.Errorf("at 60/min = %s, want wait 1000ms", describe(d))
	}
}
