package store

import (
	"context"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// DefaultAdaptive is adaptive mode for an account whose policy never set
// it: on, so the fleet learns the backend's upgrade throttle without
// configuration (clodexctl set-adaptive ACCOUNT off turns it off).
const DefaultAdaptive = true

// Adaptive mode's rules (see AdminService.SetAdaptive): after an upstream
// 403 the account's admissions pause (the 403's retry-after, or the
// learned interval) and the effective rate halves; it recovers
// additively while quiet.
const (
	// AdaptiveLowerEvery is the shortest interval between two lowerings:
	// the 403s of one burst of dials lower the rate once.
	AdaptiveLowerEvery = 10 * time.Second
	// AdaptiveRaiseEvery is the 403-free interval after which the
	// effective rate rises one step.
	AdaptiveRaiseEvery = 30 * time.Second
	// AdaptivePause is the learned interval's starting value: the pause
	// after a 403 without a retry-after.
	AdaptivePause = time.Minute
	// AdaptiveMaxPause bounds the learned interval.
	AdaptiveMaxPause = 4 * time.Minute
)

// adaptive is one account's adaptive-rate state. The zero value is off.
type adaptive struct {
	on        bool
	effective int       // the rate the bucket paces at while on
	lowered   time.Time // the last lowering; zero when none
	quiet     time.Time // start of the current 403-free interval
	// pausedUntil is when the pause after the last 403 ends; admissions
	// before it wait or are refused (pauseDecision). Zero when none.
	pausedUntil time.Time
	// learned is the pause after a 403 without a retry-after; 0 means
	// AdaptivePause.
	learned time.Duration
}

// Lower returns max(1, floor(0.5 × effective)).
func lower(effective int) int { return max(1, effective/2) }

// raiseStep returns max(1, configured / 10).
func raiseStep(configured int) int { return max(1, configured/10) }

// reset starts adaptive mode over at the configured rate, with no pause.
func (a *adaptive) reset(on bool, configured int, now time.Time) {
	*a = adaptive{on: on, effective: configured, quiet: now}
}

// rate returns the rate to pace at for configured.
func (a *adaptive) rate(configured int) int {
	if !a.on || configured == 0 {
		return configured
	}
	return min(a.effective, configured)
}

// paused returns the end of the pause when admissions at now are paused.
func (a *adaptive) paused(now time.Time) (time.Time, bool) {
	if !a.on || a.pausedUntil.IsZero() || !now.Before(a.pausedUntil) {
		return time.Time{}, false
	}
	return a.pausedUntil, true
}

// on403 applies one 403 at now, with its retry-after (0: none), and
// reports whether the effective rate or the pause changed.
//
// The pause: a retry-after extends it to now + retryAfter. Without one, a
// 403 outside a pause starts one of the learned interval, first doubled
// (up to AdaptiveMaxPause) when the 403 comes within it after the last
// pause ended (that pause was too short); a 403 inside a pause comes from
// a dial admitted before it and changes nothing. The rate: every 403
// restarts the quiet interval (from the pause's end); it halves the rate
// only when the last lowering is at least AdaptiveLowerEvery old.
func (a *adaptive) on403(configured int, now time.Time, retryAfter time.Duration) bool {
	if !a.on || configured == 0 {
		return false
	}
	a.advance(configured, now)
	changed := false
	switch {
	case retryAfter > 0:
		if until := now.Add(retryAfter); until.After(a.pausedUntil) {
			a.pausedUntil, changed = until, true
		}
	case a.pausedUntil.IsZero() || !now.Before(a.pausedUntil):
		if a.learned == 0 {
			a.learned = AdaptivePause
		}
		if !a.pausedUntil.IsZero() && now.Sub(a.pausedUntil) < a.learned {
			a.learned = min(2*a.learned, AdaptiveMaxPause)
		}
		a.pausedUntil, changed = now.Add(a.learned), true
	}
	if q := later(now, a.pausedUntil); q.After(a.quiet) {
		a.quiet = q
	}
	if !a.lowered.IsZero() && now.Sub(a.lowered) < AdaptiveLowerEvery {
		return changed
	}
	a.lowered = now
	old := a.effective
	a.effective = lower(a.effective)
	return changed || a.effective != old
}

// later returns the later of t and u.
func later(t, u time.Time) time.Time {
	if u.After(t) {
		return u
	}
	return t
}

// advance raises the effective rate one step per full quiet interval
// elapsed by now, never above configured, and reports whether it changed.
// Back at the configured rate, the learned pause starts over.
func (a *adaptive) advance(configured int, now time.Time) bool {
	if !a.on || configured == 0 || a.effective >= configured {
		return false
	}
	old := a.effective
	for a.effective < configured && now.Sub(a.quiet) >= AdaptiveRaiseEvery {
		a.effective = min(configured, a.effective+raiseStep(configured))
		a.quiet = a.quiet.Add(AdaptiveRaiseEvery)
	}
	if a.effective >= configured {
		a.learned = 0
	}
	return a.effective != old
}

// pauseDecision applies a pause ending at until to the bucket's decision
// at now: while paused, a request whose pause ends within the wait bound
// (or whose policy cannot refuse) is decided by the bucket and waits at
// least until the pause ends (at most the bound); any other is refused
// with the pause's end as its retry hint, and nothing is debited. take is
// the bucket's Take, called only when the bucket decides.
func pauseDecision(p pacing.Policy, now, until time.Time, take func() pacing.Decision) pacing.Decision {
	remaining := until.Sub(now)
	bound := p.Budget.WaitBound
	if remaining > bound && p.CanRefuse() {
		return pacing.Decision{
			Kind:         pacing.KindRefuse,
			RetryAfter:   ceilTo(remaining, time.Second),
			RequiredWait: ceilTo(remaining, time.Millisecond),
		}
	}
	d := take()
	if d.Kind == pacing.KindRefuse {
		return d
	}
	if w := ceilTo(min(remaining, bound), time.Millisecond); w > d.Wait {
		d.Kind, d.Wait = pacing.KindWait, w
		d.RequiredWait = max(d.RequiredWait, w)
	}
	return d
}

// ceilTo rounds d up to a whole multiple of unit.
func ceilTo(d, unit time.Duration) time.Duration {
	return (d + unit - 1) / unit * unit
}

// bucketPolicy is the configured policy with the effective rate.
func (e *entry) bucketPolicy() pacing.Policy {
	p := e.policy
	p.RatePerMinute = e.adapt.rate(p.RatePerMinute)
	return p
}

// advanceLocked applies adaptive raises due by now to the bucket and
// reports whether the effective rate changed.
func (e *entry) advanceLocked(now time.Time) bool {
	if !e.adapt.advance(e.policy.RatePerMinute, now) {
		return false
	}
	e.bucket.SetPolicy(now, e.bucketPolicy())
	return true
}

// SetAdaptive turns adaptive mode on or off for key; either way the
// effective rate starts over at the configured rate. The flag is stored
// with the account's policy (an account without one gets the default
// policy stored) and persisted like UpdatePolicy.
func (m *Memory) SetAdaptive(ctx context.Context, key string, enabled bool, now time.Time) (Account, error) {
	return m.updateStored(ctx, key, now, func(sp storedPolicy) (storedPolicy, error) {
		sp.Adaptive = enabled
		return sp, nil
	})
}

// Report403 records an upstream 403 for key at now with its retry-after
// (0: none). In adaptive mode it pauses the account and may lower the
// effective rate (see the package doc); changed reports whether the rate
// or the pause changed. A key without an account returns ErrNotFound.
func (m *Memory) Report403(_ context.Context, key string, now time.Time, retryAfter time.Duration) (acct Account, changed bool, err error) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.accounts[key]
	if e == nil {
		return Account{}, false, ErrNotFound
	}
	changed = e.advanceLocked(now)
	rate := e.adapt.rate(e.policy.RatePerMinute)
	if e.adapt.on403(e.policy.RatePerMinute, now, retryAfter) {
		// Only a new rate touches the bucket (a pause alone does not), as
		// report403.lua's sync does.
		if e.adapt.rate(e.policy.RatePerMinute) != rate {
			e.bucket.SetPolicy(now, e.bucketPolicy())
		}
		changed = true
	}
	return e.snapshotLocked(key, now), changed, nil
}

// Adapt applies the adaptive raises due by now and returns the accounts
// whose effective rate changed, ordered by key. The control plane calls
// it periodically to push the new rates; reads apply due raises too.
func (m *Memory) Adapt(_ context.Context, now time.Time) ([]Account, error) {
	var out []Account
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for key, e := range sh.accounts {
			if e.advanceLocked(now) {
				out = append(out, e.snapshotLocked(key, now))
			}
		}
		sh.mu.Unlock()
	}
	sortAccounts(out)
	return out, nil
}
