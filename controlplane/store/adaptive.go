package store

import (
	"context"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// Adaptive mode's rules (see AdminService.SetAdaptive).
const (
	// AdaptiveLowerEvery is the shortest interval between two lowerings.
	AdaptiveLowerEvery = 10 * time.Second
	// AdaptiveRaiseEvery is the 403-free interval after which the
	// effective rate rises one step.
	AdaptiveRaiseEvery = time.Minute
)

// adaptive is one account's adaptive-rate state. The zero value is off.
type adaptive struct {
	on        bool
	effective int       // the rate the bucket paces at while on
	lowered   time.Time // the last lowering; zero when none
	quiet     time.Time // start of the current 403-free interval
}

// Lower returns max(1, floor(0.7 × effective)).
func lower(effective int) int { return max(1, effective*7/10) }

// raiseStep returns max(1, configured / 10).
func raiseStep(configured int) int { return max(1, configured/10) }

// reset starts adaptive mode over at the configured rate.
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

// on403 applies one 403 at now and reports whether the effective rate
// changed. Every 403 restarts the quiet interval; it lowers the rate only
// when the last lowering is at least AdaptiveLowerEvery old.
func (a *adaptive) on403(configured int, now time.Time) bool {
	if !a.on || configured == 0 {
		return false
	}
	a.advance(configured, now)
	if now.After(a.quiet) {
		a.quiet = now
	}
	if !a.lowered.IsZero() && now.Sub(a.lowered) < AdaptiveLowerEvery {
		return false
	}
	a.lowered = now
	old := a.effective
	a.effective = lower(a.effective)
	return a.effective != old
}

// advance raises the effective rate one step per full quiet interval
// elapsed by now, never above configured, and reports whether it changed.
func (a *adaptive) advance(configured int, now time.Time) bool {
	if !a.on || configured == 0 || a.effective >= configured {
		return false
	}
	old := a.effective
	for a.effective < configured && now.Sub(a.quiet) >= AdaptiveRaiseEvery {
		a.effective = min(configured, a.effective+raiseStep(configured))
		a.quiet = a.quiet.Add(AdaptiveRaiseEvery)
	}
	return a.effective != old
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

// Report403 records an upstream 403 for key at now. In adaptive mode it
// may lower the effective rate (see the package doc); changed reports
// whether it did. A key without an account returns ErrNotFound.
func (m *Memory) Report403(_ context.Context, key string, now time.Time) (acct Account, changed bool, err error) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.accounts[key]
	if e == nil {
		return Account{}, false, ErrNotFound
	}
	changed = e.advanceLocked(now)
	if e.adapt.on403(e.policy.RatePerMinute, now) {
		e.bucket.SetPolicy(now, e.bucketPolicy())
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
