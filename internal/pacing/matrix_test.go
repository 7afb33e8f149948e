package pacing

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// refBudget is the test's own reading of the budget rules, in plain integer milliseconds.
// It shares no code with the package.
func refBudget(idle, total, retries int64, idleSet, totalSet, retriesSet bool) (idleMs, r, boundMs int64) {
	idleMs, r = 120000, 5
	if idleSet {
		idleMs = max(10000, min(idle, 3600000))
	}
	if totalSet {
		total = max(total, 10000)
		if total < idleMs {
			idleMs = total
		}
	}
	if retriesSet {
		r = min(retries, 10)
	}
	ladder := func(n int64) int64 { return 2000 * ((int64(1) << n) - 1) }
	for r > 0 && ladder(r) >= idleMs {
		r--
	}
	room := idleMs - ladder(r)
	boundMs = room / (2 * (r + 1))
	if boundMs > 15000 {
		boundMs = 15000
	}
	return idleMs, r, boundMs
}

// refHintS is hint_s = max(1, floor(bound_ms / 1000)), written out here rather than read from
// Budget.Hint (an oracle that calls the implementation cannot catch its mistakes).
func refHintS(boundMs int64) int64 {
	h := boundMs / 1000
	if h < 1 {
		h = 1
	}
	return h
}

func TestRefHintDirect(t *testing.T) {
	for bound, want := range map[int64]int64{4833: 4, 15000: 15, 666: 1, 0: 1, 2000: 2, 3000: 3} {
		if got := refHintS(bound); got != want {
			t.Errorf("refHintS(%d) = %d, want %d", bound, got, want)
		}
	}
}

// TestBudgetMatrix checks the safety inequality of docs/pacing.md §2 over every environment combination:
//
//	(maxRetries + 1) × bound + Σᵢ gapᵢ < idleTimeout
//
// where gapᵢ is what the client really waits before retry i: the refusal's retry-after (the
// retry loop spends it instead of the rung) or, after any other failure, the rung 2000 × 2^(i−1) ms.
// The conservative form takes gapᵢ = max(hintCapMs, rungᵢ). The hint term applies only where
// pacing is on (rate > 0, bound > 0) and the policy can refuse; elsewhere nothing is refused
// and gapᵢ is the rung. Every decision of a real fan-out is also checked against the bound and
// the independent hint, and a refused request retrying on its hints alone is admitted within
// its retries.
func TestBudgetMatrix(t *testing.T) {
	idles := []string{"", "10000", "14000", "14001", "30000", "60000", "600000", "3600000"}
	totals := []string{"", "60000"}
	retriesSet := []string{"", "0", "2", "5", "10", "99"}
	rates := []int64{1, 2, 3, 29, 30, 31, 60, 600}
	combos, refusing := 0, 0
	for _, idle := range idles {
		for _, total := range totals {
			for _, retries := range retriesSet {
				env := map[string]string{}
				if idle != "" {
					env[EnvIdleTimeout] = idle
				}
				if total != "" {
					env[EnvTotalTimeout] = total
				}
				if retries != "" {
					env[EnvMaxRetries] = retries
				}
				iv, _ := strconv.ParseInt(idle, 10, 64)
				tv, _ := strconv.ParseInt(total, 10, 64)
				rv, _ := strconv.ParseInt(retries, 10, 64)
				wantIdle, wantR, wantBound := refBudget(iv, tv, rv, idle != "", total != "", retries != "")
				for _, rate := range rates {
					combos++
					env[EnvRate] = strconv.FormatInt(rate, 10)
					name := fmt.Sprintf("idle=%q total=%q retries=%q rate=%d", idle, total, retries, rate)
					p, _ := PolicyFromEnv(envLookup(env))
					b := p.Budget
					if b.IdleTimeout != ms(wantIdle) || int64(b.MaxRetries) != wantR || b.WaitBound != ms(wantBound) {
						t.Errorf("%s: budget (%v, %d, %v), want (%dms, %d, %dms)", name, b.IdleTimeout, b.MaxRetries, b.WaitBound, wantIdle, wantR, wantBound)
						continue
					}
					on := rate > 0 && wantBound > 0
					if p.Enabled() != on {
						t.Errorf("%s: Enabled() = %v, want %v", name, p.Enabled(), on)
					}
					hintS := refHintS(wantBound)
					wantRefuse := on && wantR > 0 && wantR*hintS*1000*rate >= 60000
					if p.CanRefuse() != wantRefuse {
						t.Errorf("%s: CanRefuse() = %v, want %v", name, p.CanRefuse(), wantRefuse)
					}
					if !on {
						continue
					}
					if wantRefuse {
						refusing++
					}
					// The inequality, from the resolved numbers alone.
					spent := (wantR + 1) * wantBound
					for i := int64(1); i <= wantR; i++ {
						gap := int64(2000) << (i - 1)
						if wantRefuse {
							gap = max(gap, hintS*1000)
						}
						spent += gap
					}
					if spent >= wantIdle {
						t.Errorf("%s: (r+1)×bound + gaps = %dms, want < idle %dms", name, spent, wantIdle)
					}
					checkFanOut(t, name, p, rate, wantBound, hintS, wantR, wantRefuse)
				}
			}
		}
	}
	t.Logf("%d combinations, %d of them refusing", combos, refusing)
	if refusing == 0 {
		t.Error("no combination refuses; the hint term was never exercised")
	}
}

// checkFanOut fans out enough simultaneous requests to reach refusals (or the relaxed
// fallback), checks each decision, then retries the first refused request on its own hints.
func checkFanOut(t *testing.T, name string, p Policy, rate, boundMs, hintS, retries int64, canRefuse bool) {
	t.Helper()
	bk := NewBucket(p, t0)
	n := 10 + int(boundMs*rate/60000) + 3
	var firstRefused bool
	refusals := 0
	for i := 0; i < n; i++ {
		d := bk.Take(t0)
		switch d.Kind {
		case KindWait:
			if d.Wait > ms(boundMs) || d.Wait <= 0 {
				t.Errorf("%s: request %d waits %v, want within (0, %dms]", name, i, d.Wait, boundMs)
			}
		case KindRefuse:
			refusals++
			if d.RetryAfter != time.Duration(hintS)*time.Second {
				t.Errorf("%s: refusal asks %v, want the %ds hint", name, d.RetryAfter, hintS)
			}
			if d.Debited {
				t.Errorf("%s: refusal debited", name)
			}
			firstRefused = true
		}
		if firstRefused {
			break
		}
	}
	if canRefuse != (refusals > 0) {
		t.Errorf("%s: %d refusals in a fan-out of %d, want refusals=%v", name, refusals, n, canRefuse)
	}
	if !firstRefused {
		return
	}
	// The refused request retries on its hint alone; nothing else arrives.
	now := t0
	elapsed := int64(0)
	for attempt := int64(1); ; attempt++ {
		if attempt > retries {
			t.Errorf("%s: a refused request was still refused after %d retries", name, retries)
			return
		}
		now = now.Add(time.Duration(hintS) * time.Second)
		elapsed += hintS * 1000
		d := bk.Take(now)
		if d.Kind == KindRefuse {
			continue
		}
		elapsed += d.Wait.Milliseconds()
		break
	}
	idle := p.Budget.IdleTimeout.Milliseconds()
	if elapsed >= idle {
		t.Errorf("%s: the refused request dialled after %dms, want < idle %dms", name, elapsed, idle)
	}
}
