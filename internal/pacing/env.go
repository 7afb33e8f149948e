package pacing

import (
	"fmt"
	"strings"
	"time"
)

// Environment variable names (docs/pacing.md §1.1 and §6).
const (
	EnvRate         = "CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN"
	EnvIdleTimeout  = "CLODEX_UPSTREAM_IDLE_TIMEOUT_MS"
	EnvTotalTimeout = "CLODEX_UPSTREAM_TOTAL_TIMEOUT_MS"
	EnvMaxRetries   = "CLODEX_UPSTREAM_MAX_RETRIES"
)

// saturation caps parsed decimals so that huge inputs clamp instead of overflowing; it is
// far above every range here and below math.MaxInt64 / 1e6 (milliseconds to nanoseconds).
const saturation = 1_000_000_000_000

// parseDecimal accepts only a non-empty string of ASCII digits (already trimmed). Values
// above saturation come back as saturation.
func parseDecimal(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = min(n*10+int64(c-'0'), saturation)
	}
	return n, true
}

// PolicyFromEnv reads the four variables through lookup (os.LookupEnv in production)
// and applies the environment rules: values are trimmed decimal integers; negative,
// fractional or non-numeric values are malformed and ignored with a notice; a rate above 600
// clamps to 600 with a notice; only a literal "0" disables pacing; a zero wait bound disables
// pacing with a notice. A set but empty (or all-space) variable counts as unset. Never panics.
func PolicyFromEnv(lookup func(string) (string, bool)) (Policy, []Notice) {
	var notices []Notice
	get := func(name string) (string, bool) {
		if lookup == nil {
			return "", false
		}
		v, ok := lookup(name)
		v = strings.TrimSpace(v)
		return v, ok && v != ""
	}

	rate := DefaultRatePerMinute
	if v, ok := get(EnvRate); ok {
		n, valid := parseDecimal(v)
		if !valid || (n == 0 && v != "0") {
			notices = append(notices, Notice{
				Key:     "rate.malformed:" + v,
				Message: fmt.Sprintf("ignoring %s=%q: not a whole number 0..%d; pacing at %d/minute", EnvRate, v, MaxRatePerMinute, DefaultRatePerMinute),
			})
		} else if n == 0 {
			rate = 0
			notices = append(notices, Notice{
				Key:     KeyPacingOff,
				Message: fmt.Sprintf("not pacing new OpenAI connections: %s=0", EnvRate),
			})
		} else if n > MaxRatePerMinute {
			rate = MaxRatePerMinute
			notices = append(notices, Notice{
				Key:     "rate.clamped:" + v,
				Message: fmt.Sprintf("%s=%s is above the maximum; pacing at %d/minute", EnvRate, v, MaxRatePerMinute),
			})
		} else {
			rate = int(n)
		}
	}

	var in BudgetInput
	duration := func(name, ns string) *time.Duration {
		v, ok := get(name)
		if !ok {
			return nil
		}
		n, valid := parseDecimal(v)
		if !valid {
			notices = append(notices, Notice{
				Key:     ns + ".malformed:" + v,
				Message: fmt.Sprintf("ignoring %s=%q: not a whole number of milliseconds", name, v),
			})
			return nil
		}
		d := time.Duration(n) * time.Millisecond
		return &d
	}
	in.IdleTimeout = duration(EnvIdleTimeout, "budget.idle")
	in.TotalTimeout = duration(EnvTotalTimeout, "budget.total")
	if v, ok := get(EnvMaxRetries); ok {
		n, valid := parseDecimal(v)
		if valid {
			r := int(min(n, 1_000_000))
			in.MaxRetries = &r
		} else {
			notices = append(notices, Notice{
				Key:     "budget.retries.malformed:" + v,
				Message: fmt.Sprintf("ignoring %s=%q: not a whole number", EnvMaxRetries, v),
			})
		}
	}
	budget, bn := ResolveBudget(in)
	notices = append(notices, bn...)

	p := Policy{RatePerMinute: rate, Burst: DefaultBurst, Budget: budget}
	if rate > 0 && budget.WaitBound == 0 {
		notices = append(notices, p.DisabledNotice())
	} else if p.Enabled() && !p.CanRefuse() {
		notices = append(notices, p.NoRefuseNotice())
	}
	return p, notices
}
