package pacing

import (
	"errors"
	"fmt"
	"time"
)

// Policy is one account's pacing configuration.
type Policy struct {
	RatePerMinute int // 0 disables pacing
	Burst         int
	Budget        Budget
}

// DefaultPolicy returns 60/minute, burst 10 and the default budget.
func DefaultPolicy() Policy {
	return Policy{RatePerMinute: DefaultRatePerMinute, Burst: DefaultBurst, Budget: DefaultBudget()}
}

// Enabled reports whether pacing is on: a positive rate and a positive wait bound.
func (p Policy) Enabled() bool {
	return p.RatePerMinute > 0 && p.Budget.WaitBound > 0
}

// CanRefuse reports whether the retry schedule can outlast the wait for a free slot:
// retries > 0, bound > 0 and retries × hint_s × 1000 ≥ 60000 / rate. Without it the bucket
// never refuses; it shapes the opening burst and then relaxes the ceiling.
func (p Policy) CanRefuse() bool {
	rate, retries := int64(max(p.RatePerMinute, 0)), int64(max(p.Budget.MaxRetries, 0))
	hintS := int64(p.Budget.Hint() / time.Second)
	// retries × hint_s × 1000 ≥ 60000 / rate, multiplied through by rate to stay exact; a zero
	// rate or zero retries makes the left side 0.
	return p.Budget.WaitBound > 0 && retries*hintS*1000*rate >= 60000
}

// Validate checks explicit (admin) values without clamping: rate 0..600, burst 1..1000 and
// Budget.Validate. Every problem is reported; each names the field and the allowed range.
func (p Policy) Validate() error {
	return errors.Join(ValidateRate(p.RatePerMinute), ValidateBurst(p.Burst), p.Budget.Validate())
}

// ValidateRate checks a rate per minute is in 0..600 (0 disables pacing).
func ValidateRate(rate int) error {
	if rate < 0 || rate > MaxRatePerMinute {
		return &RangeError{Field: "rate_per_minute", Value: fmt.Sprint(rate), Allowed: "0..600"}
	}
	return nil
}

// ValidateBurst checks a burst is in 1..1000.
func ValidateBurst(burst int) error {
	if burst < 1 || burst > MaxBurst {
		return &RangeError{Field: "burst", Value: fmt.Sprint(burst), Allowed: "1..1000"}
	}
	return nil
}

// DisabledNotice is the notice for a zero wait bound. Its key is never derived from a value.
func (p Policy) DisabledNotice() Notice {
	return Notice{
		Key: KeyPacingDisabled,
		Message: fmt.Sprintf("not pacing new OpenAI connections: a %d-retry budget leaves no room to queue inside the resolved %dms request deadline",
			p.Budget.MaxRetries, p.Budget.IdleTimeout.Milliseconds()),
	}
}

// NoRefuseNotice is the notice for a policy that paces but cannot refuse.
func (p Policy) NoRefuseNotice() Notice {
	msg := fmt.Sprintf("pacing new OpenAI connections at %d/minute without refusing overflow: "+
		"with retries off nothing would retry a refusal, so excess connections are admitted late rather than failed", p.RatePerMinute)
	if p.Budget.MaxRetries > 0 && p.RatePerMinute > 0 {
		span := time.Duration(p.Budget.MaxRetries) * p.Budget.Hint()
		interval := time.Minute / time.Duration(p.RatePerMinute)
		msg = fmt.Sprintf("pacing new OpenAI connections at %d/minute without refusing overflow: a %d-retry schedule spans only %dms, "+
			"which cannot outlast the %dms wait for a free connection slot, so excess connections are admitted late rather than failed",
			p.RatePerMinute, p.Budget.MaxRetries, span.Milliseconds(), interval.Milliseconds())
	}
	return Notice{Key: KeyPacingNoRefuse, Message: msg}
}

// RelaxedNotice is the one-time notice for an admission past the ceiling (Decision.Relaxed).
func (p Policy) RelaxedNotice() Notice {
	return Notice{
		Key: KeyCeilingRelaxed,
		Message: fmt.Sprintf("admitting new OpenAI connections past the %d/minute ceiling: refusing them would fail requests whose retries cannot outlast the wait",
			p.RatePerMinute),
	}
}
