package redisstore

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/controlplane/store/storetest"
	"github.com/clodex/clodex/internal/pacing"
)

func TestRedisURLForms(t *testing.T) {
	tests := []struct {
		url, display, err string
	}{
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", ""},
		{"rediss://user:secret@cache.example:6380", "rediss://cache.example:6380", ""},
		{"redis://:secret@sentinel1:26379/2?master_name=main&addr=sentinel2:26379", "redis://sentinel1:26379/2 (sentinel, master main)", ""},
		{"", "", "redis URL is empty"},
		{"http://user:secret@h:1", "", `redis URL "http://REDACTED@h:1" is invalid`},
		{"redis://h:1?bogus=1", "", "redis URL \"redis://h:1?bogus=1\": redis: unexpected option: bogus"},
	}
	for _, tt := range tests {
		c, display, err := newClient(tt.url, time.Second)
		if c != nil {
			_ = c.Close()
		}
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) || strings.Contains(err.Error(), "secret") {
				t.Errorf("newClient(%q) = %v, want an error containing %q without the password", tt.url, err, tt.err)
			}
			continue
		}
		if err != nil || display != tt.display {
			t.Errorf("newClient(%q) = %q, %v; want %q", tt.url, display, err, tt.display)
		}
	}
}

// A hung Redis (stopped, connections open) answers nothing: every Admit
// still returns, from the local share, once the Redis deadline passes;
// the breaker then answers at once. When Redis continues, a probe closes
// the breaker and the local grants are handed over.
func TestRedisHungAdmitsFromShareWithinDeadline(t *testing.T) {
	rs := redistest.Start(t)
	clk := storetest.NewClock(t0)
	p := pacing.Policy{RatePerMinute: 60, Burst: 4, Budget: pacing.DefaultBudget()}
	const deadline = 50 * time.Millisecond
	r, err := Open(t.Context(), Options{URL: rs.URL, Now: clk.Now, Defaults: &p, Timeout: deadline, ProbeEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := t.Context()
	if a := mustAdmit(t, r, key, t0); a.Decision.ID != 1 {
		t.Fatalf("central Admit = %+v, want reservation id 1 from Redis", a)
	}
	rs.Pause()
	defer rs.Resume()
	var slowest time.Duration
	var got []string
	for range 6 {
		start := time.Now()
		a, err := r.Admit(ctx, key, t0)
		slowest = max(slowest, time.Since(start))
		if err != nil {
			t.Fatalf("Admit with Redis hung: %v", err)
		}
		got = append(got, storetest.Describe(a))
		if a.Decision.Debited && !isLocalReservation(a.Decision.ID) {
			t.Errorf("Admit with Redis hung = %+v, want a local decision", a)
		}
	}
	t.Logf("slowest Admit with Redis hung: %v (deadline %v)", slowest, deadline)
	if slowest > deadline+time.Second {
		t.Errorf("an Admit took %v with Redis hung; want the %v deadline (plus 1s of scheduling slack)", slowest, deadline)
	}
	// The local share of 60/min burst 4 on one replica is the whole policy,
	// starting empty: waits of 1..4 s, then 5 s exceeds the 4833 ms bound.
	if want := "wait 1000ms, wait 2000ms, wait 3000ms, wait 4000ms, refuse 4s deficit 5000ms, refuse 4s deficit 5000ms"; strings.Join(got, ", ") != want {
		t.Errorf("local decisions = %q, want %q", strings.Join(got, ", "), want)
	}
	if !r.Info().Degraded {
		t.Error("Info().Degraded = false with Redis hung")
	}
	if _, err := r.UpdatePolicy(ctx, key, t0, func(p pacing.Policy) (pacing.Policy, error) { return p, nil }); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("UpdatePolicy with Redis hung = %v, want ErrUnavailable", err)
	}
	if a, err := r.Account(ctx, key, t0); err != nil || a.Tokens != -4 {
		t.Errorf("Account with Redis hung = %+v, %v; want the local bucket's -4 tokens", a, err)
	}
	rs.Resume()
	for range 3000 {
		r.tryClose(ctx)
		if !r.Info().Degraded {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r.Info().Degraded {
		t.Fatal("still degraded 30s after Redis continued")
	}
	// Redis had 3 tokens left; the 4 local grants were handed over (3 now,
	// then a wait of 1 s): -1. The calls that timed out while Redis was
	// stopped sat in its socket and may have run when it continued; they
	// then count twice, which errs toward fewer admissions, and the debt
	// floor still holds: -4 at most (a 5 s wait would exceed the bound).
	if got := mustTokens(t, r, key, t0); got > -1 || got < -4 {
		t.Errorf("Redis tokens after the hand-over = %v, want -1 (4 - 1 central - 4 local), down to -4 when the timed-out calls ran late", got)
	}
}

// Concurrent Admits leave in shared pipelines; each gets its own decision,
// in one bucket: 40 callers at one instant on a burst of 10 at 60/min see
// 10 admissions now, 4 waits (1..4 s, inside the 4833 ms bound) and 26
// refusals, whatever the batches were. A Redis that lost its scripts
// (SCRIPT FLUSH, as after a restart) has them loaded again by the next
// batch.
func TestRedisConcurrentAdmitsShareBatches(t *testing.T) {
	rs := redistest.Start(t)
	clk := storetest.NewClock(t0)
	r := openRedisAt(t, rs, clk.Now, nil)
	ctx := t.Context()
	run := func(k string) map[string]int {
		var mu sync.Mutex
		got := map[string]int{}
		var wg sync.WaitGroup
		for range 40 {
			wg.Go(func() {
				a, err := r.Admit(ctx, k, t0)
				if err != nil {
					t.Errorf("Admit: %v", err)
					return
				}
				mu.Lock()
				got[storetest.Describe(a)]++
				mu.Unlock()
			})
		}
		wg.Wait()
		return got
	}
	want := map[string]int{"now": 10, "wait 1000ms": 1, "wait 2000ms": 1, "wait 3000ms": 1, "wait 4000ms": 1, "refuse 4s deficit 5000ms": 26}
	if got := run(key); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("40 concurrent Admits = %v, want %v", got, want)
	}
	if err := r.client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if got := run("acct_00000000000000b2"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after SCRIPT FLUSH: 40 concurrent Admits = %v, want %v", got, want)
	}
	if r.breaker.isOpen() {
		t.Error("the breaker opened; want every Admit decided by Redis")
	}
}

// BenchmarkRedisAdmitParallel runs Admit on a real redis-server with 64
// callers in flight, as the control plane does under bench-controlplane's
// load; allocs/op are the store's per-Admit allocations (client side).
func BenchmarkRedisAdmitParallel(b *testing.B) {
	rs := redistest.Start(b)
	r, err := Open(b.Context(), Options{URL: rs.URL, Defaults: &pacing.Policy{RatePerMinute: 600, Burst: 1000, Budget: pacing.DefaultBudget()}})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("acct_%016x", i)
	}
	b.SetParallelism(32) // 64 callers on 2 CPUs
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := r.Admit(b.Context(), keys[i%len(keys)], r.Now()); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkRedisAdmit runs Admit on a real redis-server one call at a
// time: each call is its own pipeline, so allocs/op include the
// pipeline's.
func BenchmarkRedisAdmit(b *testing.B) {
	rs := redistest.Start(b)
	r, err := Open(b.Context(), Options{URL: rs.URL, Defaults: &pacing.Policy{RatePerMinute: 600, Burst: 1000, Budget: pacing.DefaultBudget()}})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("acct_%016x", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := r.Admit(b.Context(), keys[i%len(keys)], r.Now()); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
