package retry

import (
	"math"
	"net/http"
	"strings"
	"time"
)

// A plan usage limit (usage_limit_reached, usage_not_included,
// insufficient_quota, or every account at its limit): when it resets, what
// the message says, and the headers that carry the reset
// (docs/errors.md §4.4).

// MaxResetsIn bounds UpstreamError.ResetsIn: a larger resets_in_seconds is
// read as this.
const MaxResetsIn = 30 * 24 * time.Hour

// The headers that carry a usage limit's reset time (RFC 3339), named as the
// Anthropic API names its rate-limit resets.
const (
	HeaderRequestsReset = "Anthropic-Ratelimit-Requests-Reset"
	HeaderTokensReset   = "Anthropic-Ratelimit-Tokens-Reset"
)

// resetsIn converts resets_in_seconds to a duration: 0 when absent or not
// a non-negative finite number, at most MaxResetsIn.
func resetsIn(secs float64, present bool) time.Duration {
	if !present || math.IsNaN(secs) || math.IsInf(secs, 0) || secs <= 0 {
		return 0
	}
	if secs >= MaxResetsIn.Seconds() {
		return MaxResetsIn
	}
	return time.Duration(math.Round(secs)) * time.Second
}

// resetsAt converts resets_at (Unix seconds) to a time: zero when absent,
// not a positive finite number, or implausible (before 2001 or after 5138).
func resetsAt(secs float64, present bool) time.Time {
	if !present || math.IsNaN(secs) || secs < 1e9 || secs > 1e11 {
		return time.Time{}
	}
	return time.Unix(int64(math.Round(secs)), 0).UTC()
}

// usageLimitMessage says which plan limit was reached and when it resets,
// in our own words. A reset more than MaxRetryAfter away ends with the only
// fix (waiting); a nearer one is left for the gateway's "retry after".
func usageLimitMessage(code, plan string, in time.Duration, at time.Time) string {
	var b strings.Builder
	switch code {
	case CodeUsageNotIncluded:
		b.WriteString("The ChatGPT plan does not include this usage")
	case CodeInsufficientQuota:
		b.WriteString("The account has no quota left")
	default:
		b.WriteString("The ChatGPT plan's usage limit was reached")
	}
	b.WriteString(" (" + code)
	if plan != "" {
		b.WriteString(", " + plan + " plan")
	}
	b.WriteString(")")
	switch {
	case in > 0:
		b.WriteString("; it resets in " + FormatWait(in))
		if !at.IsZero() {
			b.WriteString(" (at " + at.Format(time.RFC3339) + ")")
		}
		if in > MaxRetryAfter {
			b.WriteString("; retrying before then will not help")
		}
	case !at.IsZero():
		b.WriteString("; it resets at " + at.Format(time.RFC3339) + "; retrying before then will not help")
	default:
		b.WriteString("; the backend did not say when it resets, so retrying soon will not help")
	}
	return b.String()
}

// withResetTime returns a usage limit known only by how long until it
// resets (resets_in_seconds, as the backend sends it) with its reset time
// now + ResetsIn, rounded up to the second, and its message saying that
// time. Anything else is returned as it is; e itself is not modified.
func withResetTime(e *UpstreamError, now time.Time) *UpstreamError {
	if !e.UsageLimit || !e.ResetsAt.IsZero() || e.ResetsIn <= 0 || now.IsZero() {
		return e
	}
	c := *e
	at := now.Add(e.ResetsIn)
	if t := at.Truncate(time.Second); !t.Equal(at) {
		at = t.Add(time.Second)
	}
	c.ResetsAt = at.UTC()
	if c.limit != "" {
		c.Message = usageLimitMessage(c.limit, c.plan, c.ResetsIn, c.ResetsAt)
	}
	return &c
}

// setResetHeaders sets the reset-time headers of a usage limit whose reset
// is known. A client that does not honour x-should-retry (the Vercel AI SDK,
// opencode) would wait out any retry-after, hours included, without a word;
// these headers say when instead, and ask for no wait.
func setResetHeaders(h http.Header, e *UpstreamError) {
	if !e.UsageLimit || e.ResetsAt.IsZero() {
		return
	}
	at := e.ResetsAt.UTC().Format(time.RFC3339)
	h.Set(HeaderRequestsReset, at)
	h.Set(HeaderTokensReset, at)
}
