package retry

import (
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/clodex/clodex/dataplane/translate"
)

// RetryAfterHeader returns the retry-after value, in whole seconds, to send with a 429: a
// uniform integer in [h, ceil(1.25 h)], where h is hint rounded up to whole seconds, 5 when
// hint is 0 or negative, and at most 60. The spread keeps throttled clients from retrying in a
// herd; the value is never below the hint. rnd returns a uniform value in [0, 1) (nil:
// math/rand/v2); values outside are clamped.
func RetryAfterHeader(hint time.Duration, rnd func() float64) int {
	h := int64(translate.DefaultRetryAfter / time.Second)
	if hint > 0 {
		maxSecs := int64(translate.MaxRetryAfter / time.Second)
		h = min((int64(hint)+int64(time.Second)-1)/int64(time.Second), maxSecs)
	}
	hi := (5*h + 3) / 4 // ceil(1.25 h)
	if rnd == nil {
		rnd = rand.Float64
	}
	n := h + int64(math.Floor(unit(rnd())*float64(hi-h+1)))
	return int(min(n, hi))
}

// ShouldRetry says whether to send "x-should-retry" with a failure, and its value. It returns
// ("false", true) only for outcomes a retry cannot fix: a context overflow, a 429 usage limit
// that resets in more than 60 s, and a 401/403 after the credential was refreshed. Pacing and
// throttle 429s, and everything else, get no header: the client's own policy applies.
func ShouldRetry(e *translate.UpstreamError, f Facts) (value string, ok bool) {
	switch {
	case e == nil:
		return "", false
	case e.ContextOverflow,
		e.Status == 429 && f.UsageLimitReset > translate.MaxRetryAfter,
		(e.Status == 401 || e.Status == 403) && f.AuthRefreshed:
		return "false", true
	}
	return "", false
}

// ErrorHeaders sets the retry headers of an error response for e: retry-after (from
// RetryAfterHeader) on a 429 that carries a hint, and x-should-retry from ShouldRetry. A 429
// without a hint (a plan-level limit stated in prose) gets no invented retry-after.
func ErrorHeaders(h http.Header, e *translate.UpstreamError, f Facts, rnd func() float64) {
	if e == nil {
		return
	}
	if e.Status == 429 && e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(RetryAfterHeader(e.RetryAfter, rnd)))
	}
	if v, ok := ShouldRetry(e, f); ok {
		h.Set("X-Should-Retry", v)
	}
}
