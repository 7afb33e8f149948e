package retry

import (
	"time"

	"github.com/clodex/clodex/dataplane/translate"
)

// Facts are what the caller knows about a failure beyond the classified error.
type Facts struct {
	// AuthRefreshed is true when the credential was already refreshed for this request, so an
	// authentication or permission failure is final.
	AuthRefreshed bool
	// Wait is when a retry can next succeed, for a retryable failure that carries no hint of
	// its own (a 5xx, an unreachable upstream, a 429 without retry-after): Health.RetryAfter.
	// 0 means translate.DefaultRetryAfter.
	Wait time.Duration
}

// Classify maps a classified upstream failure that arrived before any output to a Failure:
//
//   - previous_response_not_found, websocket_connection_limit_reached: Replace;
//   - a context overflow, and a usage limit (usage_limit_reached, usage_not_included,
//     insufficient_quota) whatever its reset: Fatal, never retried inside the data plane
//     (Answer tells the client when to come back);
//   - any other 429 (including an upgrade 403, which translate maps to 429): Throttled with
//     the error's hint;
//   - 408, 409 and 5xx (502, 529, …): Backoff;
//   - anything else (400, 401, 403, 404, 413, …): Fatal. A first 401 is still Fatal here: the
//     credential refresh and its one re-run belong to the caller.
//
// It returns nil for a nil e. A failure after output must not be classified: return it as a
// plain error.
func Classify(e *translate.UpstreamError, f Facts) *Failure {
	if e == nil {
		return nil
	}
	fail := &Failure{Class: Fatal, Err: e}
	switch {
	case e.Code == translate.CodePreviousResponseNotFound, e.Code == translate.CodeConnectionLimit:
		fail.Class, fail.Hint = Replace, e.RetryAfter
	case e.ContextOverflow, e.UsageLimit:
	case e.Status == 429:
		fail.Class, fail.Hint = Throttled, e.RetryAfter
	case e.Status == 408, e.Status == 409, e.Status >= 500:
		fail.Class = Backoff
	}
	return fail
}

// Transport classifies a transport failure before any output (a socket error or close, a
// failed send, a dial error without an HTTP status): Replace on a reused socket, Backoff on a
// new one. err is surfaced as is if the retries run out; the caller maps it to 502 api_error.
func Transport(err error, reused bool) *Failure {
	if reused {
		return &Failure{Class: Replace, Err: err}
	}
	return &Failure{Class: Backoff, Err: err}
}

// Refusal classifies a pacer refusal: the next attempt waits exactly hint. err (the refusal's
// 429) is surfaced if the retries run out.
func Refusal(hint time.Duration, err error) *Failure {
	return &Failure{Class: Refused, Hint: hint, Err: err}
}

// Final marks err as fatal: Do returns it without retrying, even if it wraps a retryable
// *Failure. Use it for every failure once output has reached the client.
func Final(err error) error {
	if err == nil {
		return nil
	}
	return &Failure{Class: Fatal, Err: err}
}
