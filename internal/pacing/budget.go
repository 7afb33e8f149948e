package pacing

import (
	"errors"
	"fmt"
	"time"
)

const (
	DefaultRatePerMinute = 60
	DefaultBurst         = 10
	MaxRatePerMinute     = 600
	MaxBurst             = 1000
	DefaultIdleTimeout   = 120 * time.Second
	MinIdleTimeout       = 10 * time.Second
	MaxIdleTimeout       = time.Hour
	DefaultTotalTimeout  = 600 * time.Second
	DefaultMaxRetries    = 5
	MaxMaxRetries        = 10
	MaxWaitBound         = 15 * time.Second
)

// MinTotalTimeout is the smallest total timeout; a smaller one is raised to it.
const MinTotalTimeout = MinIdleTimeout

// ladderBase is the first rung of the retry ladder (docs/pacing.md §1.2).
const ladderBase = 2 * time.Second

// BudgetInput holds requested values; nil means unset.
type BudgetInput struct {
	IdleTimeout  *time.Duration
	TotalTimeout *time.Duration
	MaxRetries   *int
}

// Budget is a resolved request budget.
type Budget struct {
	IdleTimeout  time.Duration // the no-data deadline every attempt of one request shares
	TotalTimeout time.Duration
	MaxRetries   int
	WaitBound    time.Duration // 0: pacing cannot queue and turns itself off
}

// DefaultBudget returns the budget resolved from no input: (120s, 600s, 5, 4833ms).
func DefaultBudget() Budget {
	b, _ := ResolveBudget(BudgetInput{})
	return b
}

// Ladder returns the total backoff of a retries-long retry ladder: 2000 × (2^retries − 1) ms.
// Negative retries give 0; retries above MaxMaxRetries are treated as MaxMaxRetries.
func Ladder(retries int) time.Duration {
	retries = min(max(retries, 0), MaxMaxRetries)
	return ladderBase * time.Duration(1<<retries-1)
}

// Rung returns the retry loop's delay before retry number attempt (1-based): 2000 × 2^(attempt−1) ms.
// attempt < 1 gives 0; attempt above MaxMaxRetries is treated as MaxMaxRetries.
func Rung(attempt int) time.Duration {
	if attempt < 1 {
		return 0
	}
	attempt = min(attempt, MaxMaxRetries)
	return ladderBase << (attempt - 1)
}

// WaitBoundFor returns min(15000, floor((idle − Ladder(retries)) / 2 / (retries + 1))) ms,
// or 0 when the ladder leaves no room. idle is truncated to whole milliseconds first.
func WaitBoundFor(idle time.Duration, retries int) time.Duration {
	retries = min(max(retries, 0), MaxMaxRetries)
	idleMs := int64(idle / time.Millisecond)
	room := max(idleMs-int64(Ladder(retries)/time.Millisecond), 0)
	boundMs := room / 2 / int64(retries+1)
	return min(time.Duration(boundMs)*time.Millisecond, MaxWaitBound)
}

// ResolveBudget applies the budget rules: the idle timeout is clamped to 10s..3600s; an
// explicitly set total timeout (raised to 10s first) below the idle timeout lowers the idle
// timeout to it; retries are clamped to 0..10 and then lowered to the largest r whose
// Ladder(r) is strictly less than the idle timeout; the wait bound is derived from the result.
// Every adjustment comes with a notice. Durations are truncated to whole milliseconds.
func ResolveBudget(in BudgetInput) (Budget, []Notice) {
	var notices []Notice
	b := Budget{
		IdleTimeout:  DefaultIdleTimeout,
		TotalTimeout: DefaultTotalTimeout,
		MaxRetries:   DefaultMaxRetries,
	}
	if in.IdleTimeout != nil {
		idle := in.IdleTimeout.Truncate(time.Millisecond)
		if idle < MinIdleTimeout {
			notices = append(notices, Notice{
				Key:     "budget.idle.clamped:" + msString(idle),
				Message: fmt.Sprintf("idle timeout %dms is below the minimum; using %dms", idle.Milliseconds(), MinIdleTimeout.Milliseconds()),
			})
			idle = MinIdleTimeout
		} else if idle > MaxIdleTimeout {
			notices = append(notices, Notice{
				Key:     "budget.idle.clamped:" + msString(idle),
				Message: fmt.Sprintf("idle timeout %dms is above the maximum; using %dms", idle.Milliseconds(), MaxIdleTimeout.Milliseconds()),
			})
			idle = MaxIdleTimeout
		}
		b.IdleTimeout = idle
	}
	if in.TotalTimeout != nil {
		total := in.TotalTimeout.Truncate(time.Millisecond)
		if total < MinTotalTimeout {
			notices = append(notices, Notice{
				Key:     "budget.total.clamped:" + msString(total),
				Message: fmt.Sprintf("total timeout %dms is below the minimum; using %dms", total.Milliseconds(), MinTotalTimeout.Milliseconds()),
			})
			total = MinTotalTimeout
		}
		b.TotalTimeout = total
		if total < b.IdleTimeout {
			notices = append(notices, Notice{
				Key:     "budget.idle.lowered:" + msString(total),
				Message: fmt.Sprintf("idle timeout lowered from %dms to the %dms total timeout", b.IdleTimeout.Milliseconds(), total.Milliseconds()),
			})
			b.IdleTimeout = total
		}
	}
	if in.MaxRetries != nil {
		r := *in.MaxRetries
		if r < 0 {
			notices = append(notices, Notice{
				Key:     fmt.Sprintf("budget.retries.clamped:%d", r),
				Message: fmt.Sprintf("max retries %d is below the minimum; using 0", r),
			})
			r = 0
		} else if r > MaxMaxRetries {
			notices = append(notices, Notice{
				Key:     fmt.Sprintf("budget.retries.clamped:%d", r),
				Message: fmt.Sprintf("max retries %d is above the maximum; using %d", r, MaxMaxRetries),
			})
			r = MaxMaxRetries
		}
		b.MaxRetries = r
	}
	if fit := fittingRetries(b.IdleTimeout, b.MaxRetries); fit < b.MaxRetries {
		notices = append(notices, Notice{
			Key: fmt.Sprintf("budget.retries.lowered:%d", fit),
			Message: fmt.Sprintf("max retries lowered from %d to %d: a longer backoff ladder does not fit the %dms idle timeout",
				b.MaxRetries, fit, b.IdleTimeout.Milliseconds()),
		})
		b.MaxRetries = fit
	}
	b.WaitBound = WaitBoundFor(b.IdleTimeout, b.MaxRetries)
	return b, notices
}

// fittingRetries lowers r to the largest value whose ladder is strictly shorter than idle.
func fittingRetries(idle time.Duration, r int) int {
	for r > 0 && Ladder(r) >= idle {
		r--
	}
	return r
}

func msString(d time.Duration) string { return fmt.Sprintf("%d", d.Milliseconds()) }

// Hint returns the retry-after a refusal asks for at most: max(1, floor(bound_ms/1000))
// whole seconds. It is capped at the bound so that a refused request spends its retries inside
// its deadline, and floored at one second because zero would mean "retry immediately".
func (b Budget) Hint() time.Duration {
	return time.Duration(max(int64(b.WaitBound/time.Second), 1)) * time.Second
}

// Validate checks explicit (admin) values without clamping: idle timeout in 10s..3600s,
// total timeout at least 10s, retries in 0..10. Every problem is reported.
func (b Budget) Validate() error {
	var errs []error
	if b.IdleTimeout < MinIdleTimeout || b.IdleTimeout > MaxIdleTimeout {
		errs = append(errs, &RangeError{Field: "idle_timeout_ms", Value: fmt.Sprint(b.IdleTimeout.Milliseconds()), Allowed: "10000..3600000"})
	}
	if b.TotalTimeout < MinTotalTimeout {
		errs = append(errs, &RangeError{Field: "total_timeout_ms", Value: fmt.Sprint(b.TotalTimeout.Milliseconds()), Allowed: "10000 or more"})
	}
	if b.MaxRetries < 0 || b.MaxRetries > MaxMaxRetries {
		errs = append(errs, &RangeError{Field: "max_retries", Value: fmt.Sprint(b.MaxRetries), Allowed: "0..10"})
	}
	return errors.Join(errs...)
}

// RangeError reports an explicit value outside its allowed range. The admin API maps it to
// InvalidArgument; nothing on that path clamps.
type RangeError struct {
	Field   string // e.g. "rate_per_minute"
	Value   string // the rejected value as given
	Allowed string // e.g. "0..600"
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("%s %s is out of range; allowed %s", e.Field, e.Value, e.Allowed)
}
