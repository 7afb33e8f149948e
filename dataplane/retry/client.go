package retry

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryAfterHeader returns the retry-after value, in whole seconds, to send with a 429: a
// uniform integer in [h, ceil(1.25 h)], where h is hint rounded up to whole seconds, 5 when
// hint is 0 or negative, and at most 60. The spread keeps throttled clients from retrying in a
// herd; the value is never below the hint. rnd returns a uniform value in [0, 1) (nil:
// math/rand/v2); values outside are clamped.
func RetryAfterHeader(hint time.Duration, rnd func() float64) int {
	h := int64(DefaultRetryAfter / time.Second)
	if hint > 0 {
		maxSecs := int64(MaxRetryAfter / time.Second)
		h = min((int64(hint)+int64(time.Second)-1)/int64(time.Second), maxSecs)
	}
	hi := (5*h + 3) / 4 // ceil(1.25 h)
	if rnd == nil {
		rnd = rand.Float64
	}
	n := h + int64(math.Floor(unit(rnd())*float64(hi-h+1)))
	return int(min(n, hi))
}

// ShouldRetry says whether to send "x-should-retry" with a failure, and its value: "false"
// for outcomes a retry cannot fix (a context overflow, a usage limit that resets more than
// 60 s from now or at an unknown time, a 401/403 after the credential was refreshed), "true"
// for every failure a retry can fix (408, 409, 429 and 5xx, including a usage limit that
// resets within 60 s). Other failures (400, 404, 413, a first 401) get no header: the
// client's own policy applies.
func ShouldRetry(e *UpstreamError, f Facts) (value string, ok bool) {
	switch {
	case e == nil:
		return "", false
	case e.ContextOverflow, e.Permanent,
		e.UsageLimit && !e.Retryable(),
		(e.Status == 401 || e.Status == 403) && f.AuthRefreshed:
		return "false", true
	case e.Retryable():
		return "true", true
	}
	return "", false
}

// retryHint is the wait a retryable failure states itself: a usage limit's reset, a 429's
// hint; else f.Wait, else DefaultRetryAfter.
func retryHint(e *UpstreamError, f Facts) time.Duration {
	switch {
	case e.UsageLimit && e.ResetsIn > 0:
		return e.ResetsIn
	case e.RetryAfter > 0:
		return e.RetryAfter
	case f.Wait > 0:
		return f.Wait
	}
	return DefaultRetryAfter
}

// Answer prepares what the client is told about e before any output: it sets the retry
// headers on h and returns e with its message completed; e itself is not modified.
//
// A failure a retry can fix gets "x-should-retry: true" and a retry-after in whole seconds
// drawn by RetryAfterHeader from its own hint (a usage limit's reset, a 429's retry-after)
// or else f.Wait (when the upstream is due to be tried again), and its message ends with
// "; retry after Ns" unless it already says when to retry. A failure no retry can fix gets
// "x-should-retry: false" where ShouldRetry says so, and no retry-after: a usage limit that
// resets more than 60 s from now says when in its message and in the
// anthropic-ratelimit-requests-reset and anthropic-ratelimit-tokens-reset headers (RFC 3339),
// which every usage limit with a known reset carries. A reset known only as a duration
// (resets_in_seconds) is dated from f.Now.
func Answer(h http.Header, e *UpstreamError, f Facts, rnd func() float64) *UpstreamError {
	if e == nil {
		return nil
	}
	e = withResetTime(e, f.Now)
	setResetHeaders(h, e)
	v, ok := ShouldRetry(e, f)
	if ok {
		h.Set("X-Should-Retry", v)
	}
	if v != "true" {
		// No retry-after, not even the reset: a client that ignores
		// x-should-retry (the Vercel AI SDK, opencode) would otherwise
		// wait it out, hours or days, in silence.
		return e
	}
	secs := RetryAfterHeader(retryHint(e, f), rnd)
	h.Set("Retry-After", strconv.Itoa(secs))
	if strings.Contains(e.Message, "retry after") {
		return e
	}
	c := *e
	c.Message += fmt.Sprintf("; retry after %ds", secs)
	return &c
}
