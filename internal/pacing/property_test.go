package pacing

import (
	"math/big"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// refBucket is an exact rational model of the decision rule, written from docs/pacing.md §3.
// It shares no code with Bucket.
type refBucket struct {
	tokens                      *big.Rat
	lastNs                      int64
	rate, burst, boundMs, hintS int64
	enabled, canRefuse          bool
	outstanding                 map[uint64]bool
	nextID                      uint64
}

func newRefBucket(rate, burst, boundMs, retries int64) *refBucket {
	hint := boundMs / 1000
	if hint < 1 {
		hint = 1
	}
	return &refBucket{
		tokens:      big.NewRat(burst, 1),
		rate:        rate,
		burst:       burst,
		boundMs:     boundMs,
		hintS:       hint,
		enabled:     rate > 0 && boundMs > 0,
		canRefuse:   rate > 0 && boundMs > 0 && retries > 0 && retries*hint*1000*rate >= 60000,
		outstanding: map[uint64]bool{},
	}
}

func ratCeil(r *big.Rat) int64 {
	q, m := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

func (m *refBucket) advance(atNs int64) {
	if atNs <= m.lastNs {
		return
	}
	add := big.NewRat((atNs-m.lastNs)*m.rate, 60_000_000_000) // tokens per ns = rate / 60e9
	m.tokens.Add(m.tokens, add)
	if m.tokens.Cmp(big.NewRat(m.burst, 1)) > 0 {
		m.tokens.SetInt64(m.burst)
	}
	m.lastNs = atNs
}

func (m *refBucket) take(atNs int64) Decision {
	if !m.enabled {
		return Decision{Kind: KindAdmit}
	}
	m.advance(atNs)
	one := big.NewRat(1, 1)
	debit := func(d Decision) Decision {
		m.tokens.Sub(m.tokens, one)
		m.nextID++
		m.outstanding[m.nextID] = true
		d.Debited, d.ID = true, m.nextID
		return d
	}
	if m.tokens.Cmp(one) >= 0 {
		return debit(Decision{Kind: KindAdmit})
	}
	// w in ms = (1 − tokens) / (rate / 60000)
	w := new(big.Rat).Sub(one, m.tokens)
	w.Mul(w, big.NewRat(60000, m.rate))
	wCeil := time.Duration(ratCeil(w)) * time.Millisecond
	if w.Cmp(big.NewRat(m.boundMs, 1)) <= 0 {
		return debit(Decision{Kind: KindWait, Wait: wCeil, RequiredWait: wCeil})
	}
	if m.canRefuse {
		s := ratCeil(new(big.Rat).Quo(w, big.NewRat(1000, 1)))
		return Decision{Kind: KindRefuse, RetryAfter: time.Duration(min(m.hintS, s)) * time.Second, RequiredWait: wCeil}
	}
	floor := big.NewRat(-m.boundMs*m.rate, 60000)
	if m.tokens.Cmp(floor) > 0 {
		return debit(Decision{Kind: KindWait, Wait: time.Duration(m.boundMs) * time.Millisecond, RequiredWait: wCeil})
	}
	return Decision{Kind: KindAdmit, Relaxed: true}
}

func (m *refBucket) refund(atNs int64, id uint64) bool {
	if !m.outstanding[id] {
		return false
	}
	delete(m.outstanding, id)
	if !m.enabled {
		return true
	}
	m.advance(atNs)
	m.tokens.Add(m.tokens, big.NewRat(1, 1))
	if m.tokens.Cmp(big.NewRat(m.burst, 1)) > 0 {
		m.tokens.SetInt64(m.burst)
	}
	return true
}

// drawPolicy draws a policy across the whole valid space, weighted toward the interesting
// corners (low rates, the production bounds, tiny bursts).
func drawPolicy(t *rapid.T) (Policy, int64, int64, int64, int64) {
	rate := rapid.OneOf(rapid.SampledFrom([]int64{0, 1, 2, 3, 29, 30, 31, 60, 600}), rapid.Int64Range(1, 600)).Draw(t, "rate")
	burst := rapid.OneOf(rapid.Int64Range(1, 12), rapid.Int64Range(1, 1000)).Draw(t, "burst")
	boundMs := rapid.OneOf(rapid.SampledFrom([]int64{0, 666, 1333, 2000, 3000, 4833, 15000}), rapid.Int64Range(0, 15000)).Draw(t, "boundMs")
	retries := rapid.Int64Range(0, 10).Draw(t, "retries")
	p := Policy{RatePerMinute: int(rate), Burst: int(burst), Budget: Budget{
		IdleTimeout: DefaultIdleTimeout, TotalTimeout: DefaultTotalTimeout, MaxRetries: int(retries), WaitBound: ms(boundMs),
	}}
	return p, rate, burst, boundMs, retries
}

// drawRefusingPolicy draws a policy that paces and can refuse.
func drawRefusingPolicy(t *rapid.T) (Policy, int64) {
	rate := rapid.OneOf(rapid.SampledFrom([]int64{3, 30, 31, 60, 600}), rapid.Int64Range(3, 600)).Draw(t, "rate")
	burst := rapid.OneOf(rapid.Int64Range(1, 12), rapid.Int64Range(1, 1000)).Draw(t, "burst")
	boundMs := rapid.OneOf(rapid.SampledFrom([]int64{1333, 2000, 3000, 4833, 15000}), rapid.Int64Range(1000, 15000)).Draw(t, "boundMs")
	retries := rapid.Int64Range(1, 10).Draw(t, "retries")
	p := Policy{RatePerMinute: int(rate), Burst: int(burst), Budget: Budget{MaxRetries: int(retries), WaitBound: ms(boundMs)}}
	if !p.CanRefuse() {
		t.Skip("drew a policy that cannot refuse")
	}
	return p, rate
}

func drawStep(t *rapid.T) time.Duration {
	ns := rapid.OneOf(
		rapid.Just(int64(0)),
		rapid.Just(int64(0)),
		rapid.Int64Range(0, int64(3*time.Second)),
		rapid.Int64Range(0, int64(90*time.Second)),
	).Draw(t, "step")
	return time.Duration(ns)
}

// TestPropertyModel checks every decision and every token count against the exact model, and
// checks the invariants directly on the bucket: no token leak (a Take changes tokens by exactly
// −1 when it debits and by 0 otherwise; a refund by +1 capped at capacity), tokens never above
// capacity, the floors (tokens ≥ F with refusals; tokens > F − 1 without), refusal never
// debits, and RefundReservation refunds each reservation at most once.
func TestPropertyModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, rate, burst, boundMs, retries := drawPolicy(t)
		b := NewBucket(p, t0)
		m := newRefBucket(rate, burst, boundMs, retries)
		floor := -boundMs * int64(time.Millisecond) * rate // F in units
		var ids []uint64
		now := int64(0)
		steps := rapid.IntRange(1, 150).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			now += int64(drawStep(t))
			at := t0.Add(time.Duration(now))
			before := b.Tokens(at)
			beforeUnits := b.refilledAt(at)
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 8 || len(ids) == 0:
				got := b.Take(at)
				want := m.take(now)
				if got != want {
					t.Fatalf("step %d at +%v: Take = %+v, model %+v", i, time.Duration(now), got, want)
				}
				delta := b.units - beforeUnits
				if got.Debited && delta != -tokenUnits || !got.Debited && delta != 0 {
					t.Fatalf("step %d: Take %+v changed tokens by %d units", i, got, delta)
				}
				if got.Kind == KindRefuse && b.Tokens(at) != before {
					t.Fatalf("step %d: a refusal changed tokens %v -> %v", i, before, b.Tokens(at))
				}
				if got.Debited {
					ids = append(ids, got.ID)
				}
			default:
				id := rapid.SampledFrom(append(ids, 0, uint64(len(ids)+1000))).Draw(t, "id")
				got := b.RefundReservation(at, id)
				if want := m.refund(now, id); got != want {
					t.Fatalf("step %d: RefundReservation(%d) = %v, model %v", i, id, got, want)
				}
				if got && p.Enabled() && b.units != min(beforeUnits+tokenUnits, burst*tokenUnits) {
					t.Fatalf("step %d: refund moved tokens %d -> %d units", i, beforeUnits, b.units)
				}
			}
			if p.Enabled() {
				wantUnits := new(big.Rat).Mul(m.tokens, big.NewRat(tokenUnits, 1))
				if !wantUnits.IsInt() || wantUnits.Num().Int64() != b.units {
					t.Fatalf("step %d: units %d, model %v", i, b.units, wantUnits.FloatString(3))
				}
			}
			if b.units > burst*tokenUnits {
				t.Fatalf("step %d: tokens %v above capacity %d", i, b.Tokens(at), burst)
			}
			if p.Enabled() && p.CanRefuse() && b.units < floor {
				t.Fatalf("step %d: tokens %v below the floor %v with refusals on", i, b.Tokens(at), float64(floor)/float64(tokenUnits))
			}
			if p.Enabled() && b.units <= floor-tokenUnits {
				t.Fatalf("step %d: tokens %v at or below F − 1", i, b.Tokens(at))
			}
		}
	})
}

// refilledAt is a test helper: the exact units at now without changing the bucket.
func (b *Bucket) refilledAt(now time.Time) int64 {
	if b.enabled && now.After(b.updated) {
		return b.refilled(int64(now.Sub(b.updated)))
	}
	return b.units
}

// TestPropertyFIFO: with refusals on and no cancellations, every debited admission departs
// (arrival + Wait) no earlier than the one before it, and at least 60000/rate ms − 1 ms later
// when it waited (one millisecond of slack for rounding waits up to whole milliseconds).
// Requests queued at the same instant depart exactly 60000/rate ms apart, within that rounding.
func TestPropertyFIFO(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, rate := drawRefusingPolicy(t)
		b := NewBucket(p, t0)
		interval := time.Minute / time.Duration(rate)
		var lastDep time.Time
		var lastWait time.Duration // 0 when the previous debited admission went out at once
		var lastAt time.Time
		haveLast := false
		now := t0
		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			now = now.Add(drawStep(t))
			d := b.Take(now)
			if !d.Debited {
				continue
			}
			dep := now.Add(d.Wait)
			if haveLast {
				if dep.Before(lastDep) {
					t.Fatalf("step %d: departure %v before the previous %v", i, dep.Sub(t0), lastDep.Sub(t0))
				}
				if d.Kind == KindWait && lastWait > 0 && dep.Sub(lastDep) < interval-time.Millisecond {
					t.Fatalf("step %d: queued departure %v after the previous, want ≥ %v", i, dep.Sub(lastDep), interval)
				}
				if d.Kind == KindWait && now.Equal(lastAt) && lastWait > 0 {
					gap := d.Wait - lastWait
					if gap < interval.Truncate(time.Millisecond) || gap > interval.Truncate(time.Millisecond)+time.Millisecond {
						t.Fatalf("step %d: same-instant waits %v then %v, want %v apart", i, lastWait, d.Wait, interval)
					}
				}
			}
			lastDep, lastAt, haveLast = dep, now, true
			lastWait = 0
			if d.Kind == KindWait {
				lastWait = d.Wait
			}
		}
	})
}

// TestPropertyNonCompressive: the pacer cannot turn spread-out arrivals into a herd.
//
// Precisely, for every window [s, s+L] spanned by two departures (admission instants:
// arrival + Wait, for immediate, waiting and relaxed admissions alike), the number of
// departures inside it is at most A(L + 1ms), the largest number of arrivals (every Take,
// refused or not) inside any window of length L + 1ms. The millisecond is rounding: waits are
// reported rounded up to whole milliseconds, which can move a departure up to 1ms later.
// No cancellations happen in these runs (a cancellation lets one extra request out early).
//
// This holds as stated for policies that refuse and for disabled pacing. It does not hold
// for the low-rate fallback (pacing that cannot refuse): that fallback delays some requests
// by exactly the bound and admits others at once, so the two streams can land together — a
// consequence of relaxing the ceiling, found by this test, not a guarantee to rely on. For
// those policies the test asserts the weaker bound 2 × A(L + 1ms).
func TestPropertyNonCompressive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, _, _, _, _ := drawPolicy(t)
		factor := 1
		if p.Enabled() && !p.CanRefuse() {
			factor = 2
		}
		b := NewBucket(p, t0)
		var arrivals, deps []time.Duration
		now := time.Duration(0)
		steps := rapid.IntRange(1, 120).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			now += drawStep(t)
			d := b.Take(t0.Add(now))
			arrivals = append(arrivals, now)
			if d.Kind != KindRefuse {
				deps = append(deps, now+d.Wait)
			}
		}
		slices.Sort(deps)
		maxArrivals := func(l time.Duration) int {
			best, lo := 0, 0
			for hi := range arrivals {
				for arrivals[hi]-arrivals[lo] > l {
					lo++
				}
				best = max(best, hi-lo+1)
			}
			return best
		}
		for i := range deps {
			for j := i; j < len(deps); j++ {
				l := deps[j] - deps[i]
				if n, a := j-i+1, maxArrivals(l+time.Millisecond); n > a*factor {
					t.Fatalf("%d departures within %v, but at most %d arrivals in any window that long", n, l, a)
				}
			}
		}
	})
}

// TestPropertyRefusedRequestIsServed: when the policy refuses, a refused request that retries
// on the hint it was given, with no other traffic, is admitted within its retries and dials
// within (retries + 1) × bound + retries × hint.
func TestPropertyRefusedRequestIsServed(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, _ := drawRefusingPolicy(t)
		boundMs, retries := p.Budget.WaitBound.Milliseconds(), int64(p.Budget.MaxRetries)
		b := NewBucket(p, t0)
		now := t0
		var refused Decision
		for i := 0; i < 3000; i++ {
			now = now.Add(drawStep(t) / 20)
			if d := b.Take(now); d.Kind == KindRefuse {
				refused = d
				break
			}
		}
		if refused.Kind != KindRefuse {
			t.Skip("no refusal reached")
		}
		hint := refused.RetryAfter
		for attempt := int64(1); attempt <= retries; attempt++ {
			now = now.Add(hint)
			d := b.Take(now)
			if d.Kind == KindRefuse {
				hint = d.RetryAfter
				continue
			}
			if d.Wait > ms(boundMs) {
				t.Fatalf("admitted with wait %v beyond the bound %dms", d.Wait, boundMs)
			}
			return
		}
		t.Fatalf("still refused after %d retries on hints of %v", retries, hint)
	})
}
