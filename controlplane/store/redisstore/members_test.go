package redisstore

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/pacing"
)

var (
	_ controlplane.MemberStore   = (*Store)(nil)
	_ controlplane.MemberBuckets = (*Store)(nil)
)

func testMember(name string, rate int) store.Member {
	return store.Member{Name: name, Digest: bytes.Repeat([]byte{byte(len(name))}, 32), Accounts: []string{key}, RatePerMinute: rate, Created: t0}
}

// Members are durable records: after a FLUSHALL the replicas put back the
// members they hold, each at its version, and a member removed before the
// loss stays removed (its removal is put back too, so a copy another
// replica holds does not bring it back).
func TestMembersHealedAfterLoss(t *testing.T) {
	rs := redistest.Start(t)
	raw := rawClient(t, rs)
	ctx := t.Context()
	a := openReplica(t, rs, "mheal:", "cp-a", nil)
	b := openReplica(t, rs, "mheal:", "cp-b", nil)
	for _, m := range []store.Member{testMember("alice", 3), testMember("bob", 0)} {
		if err := a.PutMember(ctx, m); err != nil {
			t.Fatalf("PutMember(%s): %v", m.Name, err)
		}
	}
	if ms, err := b.Members(ctx); err != nil || len(ms) != 2 {
		t.Fatalf("Members on cp-b = %+v, %v; want both", ms, err)
	}
	if err := b.RemoveMember(ctx, "bob"); err != nil { // cp-a still holds bob
		t.Fatal(err)
	}
	aliceV := a.ledger.membersCopy()["alice"].Version
	a.startRun(t)
	b.startRun(t)
	if err := raw.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 30*time.Second, "both replicas heal and alice is back", func() bool {
		ia, ib := a.Info(), b.Info()
		return !ia.LostAt.IsZero() && !ib.LostAt.IsZero() && !ia.Healing && !ib.Healing && raw.HExists(ctx, "mheal:members", "alice").Val()
	})
	t.Logf("FLUSHALL to the members back in redis: %v", took.Round(time.Millisecond))
	for _, rep := range []*replica{a, b} {
		ms, err := rep.Members(ctx)
		if err != nil || len(ms) != 1 || ms[0].Name != "alice" || ms[0].RatePerMinute != 3 || ms[0].Version != aliceV {
			t.Errorf("%s: Members after the loss = %+v, %v; want alice alone, at version %d (bob stays removed)", rep.replica, ms, err, aliceV)
		}
	}
	if raw.HExists(ctx, "mheal:members", "bob").Val() {
		t.Error("bob, removed before the loss, is back in redis")
	}
}

// A member record that does not decode affects only itself: it is listed
// unreadable with the last good copy (and repaired from it when the copy
// is of the stored version), the other members are served, and the
// breaker stays closed. A member's bucket state that does not decode
// starts over.
func TestGarbageMemberAffectsOnlyItself(t *testing.T) {
	rs := redistest.Start(t)
	raw := rawClient(t, rs)
	ctx := t.Context()
	a := openReplica(t, rs, "mbad:", "cp-a", nil)
	for _, m := range []store.Member{testMember("alice", 3), testMember("bob", 0)} {
		if err := a.PutMember(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := raw.HSet(ctx, "mbad:members", "alice", "not a member").Err(); err != nil {
		t.Fatal(err)
	}
	ms, err := a.Members(ctx)
	if err != nil || len(ms) != 2 || ms[0].Name != "alice" || ms[0].RatePerMinute != 3 || ms[1].Name != "bob" {
		t.Errorf("Members with alice's record garbage = %+v, %v; want alice from the copy and bob", ms, err)
	}
	if a.breaker.isOpen() {
		t.Error("a garbage member opened the breaker")
	}
	if rec := raw.HGet(ctx, "mbad:members", "alice").Val(); !strings.Contains(rec, `"rate_per_minute":3`) {
		t.Errorf("alice's record after the read = %q; want it repaired from the copy", rec)
	}
	// Without a copy (another replica): listed unreadable, naming the record.
	b := openReplica(t, rs, "mbad:", "cp-b", nil)
	if err := raw.HSet(ctx, "mbad:members", "carol", "garbage").Err(); err != nil {
		t.Fatal(err)
	}
	ms, err = b.Members(ctx)
	var carol store.Member
	for _, m := range ms {
		if m.Name == "carol" {
			carol = m
		}
	}
	if err != nil || len(ms) != 3 || !strings.Contains(carol.Unreadable, "mbad:members field carol") {
		t.Errorf("Members with carol garbage and no copy = %+v, %v; want carol unreadable, naming the record", ms, err)
	}

	p := store.MemberPolicy(3, pacing.DefaultBudget())
	if _, err := a.AdmitMember(ctx, "alice", p, t0); err != nil {
		t.Fatal(err)
	}
	if err := raw.HSet(ctx, "mbad:mb:alice", "s", "garbage").Err(); err != nil {
		t.Fatal(err)
	}
	d, err := a.AdmitMember(ctx, "alice", p, t0)
	if err != nil || d.Kind != pacing.KindAdmit || isLocalReservation(d.ID) {
		t.Errorf("AdmitMember over a garbage bucket state = %+v, %v; want a central admission of a bucket started over", d, err)
	}
}
