package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/store"
)

// The live-agent directory: agents touched through one store handle are
// counted through another sharing the same state (for Redis, another
// replica), until their until passes or their stream is dropped; a
// dropped old stream does not forget the agent's newer one.
func liveAgents(t *testing.T, k Kind) {
	const (
		k1 = "acct_00000000000000a1"
		k2 = "acct_00000000000000a2"
		k3 = "acct_00000000000000a3"
	)
	clk := NewClock(t0)
	a := k.Open(t, clk.Now, nil)
	b := k.Peer(t, a, clk.Now)
	ctx := t.Context()
	count := func(s Store, at time.Duration) []int {
		t.Helper()
		n, err := s.LiveAgents(ctx, []string{k1, k2, k3}, t0.Add(at))
		if err != nil {
			t.Fatalf("LiveAgents: %v", err)
		}
		return n
	}
	touch := func(s Store, agent, stream string, until time.Duration, keys ...string) {
		t.Helper()
		if err := s.TouchAgent(ctx, store.AgentStream{Agent: agent, Stream: stream}, keys, t0.Add(until)); err != nil {
			t.Fatalf("TouchAgent: %v", err)
		}
	}
	drop := func(s Store, agent, stream string, keys ...string) {
		t.Helper()
		if err := s.DropAgent(ctx, store.AgentStream{Agent: agent, Stream: stream}, keys); err != nil {
			t.Fatalf("DropAgent: %v", err)
		}
	}
	check := func(what string, got []int, want ...int) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: live agents = %v, want %v", what, got, want)
		}
	}
	check("empty", count(b, 0), 0, 0, 0)
	touch(a, "h1", "s1", 15*time.Second, k1, k2) // on replica a
	touch(b, "h2", "s1", 15*time.Second, k1)     // on replica b
	touch(b, "h3", "s1", 20*time.Second, k1, k3)
	check("three agents on two replicas", count(a, time.Second), 3, 1, 1)
	check("read through the other replica", count(b, time.Second), 3, 1, 1)
	// h1 reconnects to b with a new stream; a drops the old one.
	touch(b, "h1", "s2", 16*time.Second, k1, k2)
	drop(a, "h1", "s1", k1, k2)
	check("the old stream's drop keeps the new one", count(a, 2*time.Second), 3, 1, 1)
	// h2 leaves: its stream is dropped.
	drop(b, "h2", "s1", k1)
	check("after a goodbye", count(a, 2*time.Second), 2, 1, 1)
	// Liveness ends at until: h1 at 16 s, h3 at 20 s.
	check("just before h1's until", count(a, 16*time.Second-time.Millisecond), 2, 1, 1)
	check("at h1's until", count(b, 16*time.Second), 1, 0, 1)
	check("at h3's until", count(a, 20*time.Second), 0, 0, 0)
	// A heartbeat extends it.
	touch(a, "h3", "s1", 40*time.Second, k3)
	check("after a heartbeat", count(b, 30*time.Second), 0, 0, 1)
}

func quotas(t *testing.T, k Kind) {
	qs := k.Open(t, nil, nil)
	ctx := t.Context()
	reset := t0.Add(5 * time.Hour)
	prim := store.QuotaWindow{Name: "primary", UsedPercent: 7, Window: 5 * time.Hour, ResetsAt: reset}
	sec := store.QuotaWindow{Name: "secondary", UsedPercent: 29, Window: 7 * 24 * time.Hour, ResetsAt: t0.Add(100 * time.Hour)}
	if q, err := qs.Quotas(ctx, ""); err != nil || len(q) != 0 {
		t.Fatalf("Quotas of an empty store = %v, %v; want none", q, err)
	}
	prev, next, err := qs.PutQuota(ctx, store.Quota{Key: key, PlanType: "pro", Windows: []store.QuotaWindow{sec, prim}, ReportedAt: t0, AgentID: "a-1"})
	if err != nil || prev.Key != "" || len(next.Windows) != 2 || next.Windows[0].Name != "primary" {
		t.Fatalf("first PutQuota = %+v, %+v, %v; want no previous quota and both windows, primary first", prev, next, err)
	}
	// A newer report with only the primary window keeps the secondary.
	prim2 := prim
	prim2.UsedPercent = 91.5
	if _, _, err := qs.PutQuota(ctx, store.Quota{Key: key, PlanType: "pro", Windows: []store.QuotaWindow{prim2}, ReportedAt: t0.Add(time.Minute), AgentID: "a-2"}); err != nil {
		t.Fatal(err)
	}
	// An older report (from a slow agent) changes nothing.
	prim3 := prim
	prim3.UsedPercent = 1
	prev, _, err = qs.PutQuota(ctx, store.Quota{Key: key, Windows: []store.QuotaWindow{prim3}, ReportedAt: t0.Add(30 * time.Second), AgentID: "a-3"})
	if err != nil || prev.AgentID != "a-2" || len(prev.Windows) != 2 || prev.Windows[0].UsedPercent != 91.5 {
		t.Fatalf("PutQuota of an older report: previous %+v, %v; want a-2's, 91.5%% primary", prev, err)
	}
	if _, _, err := qs.PutQuota(ctx, store.Quota{Key: key2, PlanType: "plus", LimitReached: true, ReportedAt: t0}); err != nil {
		t.Fatal(err)
	}
	all, err := qs.Quotas(ctx, "")
	if err != nil || len(all) != 2 || all[0].Key != key || all[1].Key != key2 {
		t.Fatalf("Quotas = %+v, %v; want %s then %s", all, err, key, key2)
	}
	q := all[0]
	if q.PlanType != "pro" || q.AgentID != "a-2" || !q.ReportedAt.Equal(t0.Add(time.Minute)) || len(q.Windows) != 2 {
		t.Fatalf("quota = %+v; want a-2's report of both windows", q)
	}
	p, s2 := q.Windows[0], q.Windows[1]
	if p.UsedPercent != 91.5 || p.Window != 5*time.Hour || !p.ResetsAt.Equal(reset) || !p.ReportedAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("primary = %+v; want 91.5%% of 5h resetting at +5h, reported at +1m", p)
	}
	if s2.UsedPercent != 29 || !s2.ReportedAt.Equal(t0) {
		t.Errorf("secondary = %+v; want the first report's 29%%", s2)
	}
	one, err := qs.Quotas(ctx, key2)
	if err != nil || len(one) != 1 || !one[0].LimitReached || one[0].PlanType != "plus" {
		t.Errorf("Quotas(%s) = %+v, %v; want its limit-reached quota", key2, one, err)
	}
}
