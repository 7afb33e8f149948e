// Package retry schedules the attempts of one upstream request inside its budget. It is pure:
// it opens no sockets, time comes from an injected Clock and jitter from an injected random
// source, so every schedule can be asserted exactly in tests.
//
// # Running a request
//
// Do runs attempt(ctx, Attempt) until it succeeds, fails fatally, runs out of retries, or the
// next wait would pass the request's idle or total deadline:
//
//	err := retry.Do(ctx, retry.Config{Budget: budget, Logger: logger},
//		func(ctx context.Context, a retry.Attempt) error {
//			// a.Replacement: use a new socket with the full context, unpaced.
//			// a.Previous.Class == retry.Refused: ask the pacer again.
//			for { frame := next(ctx); a.Idle.Reset(); ... }
//		})
//
// An attempt reports a classified failure by returning a *Failure (or an error wrapping one);
// any other non-nil error is fatal. A failure after output has reached the client must be
// returned through Final (or as a plain error): nothing is ever replayed after output.
//
// # The failure table
//
// Every upstream failure is classified here, once, and mapped here to what the client gets:
//
//	f := retry.Classify(err, retry.Facts{Reused: lease.Reused, Upstream: key, Now: now}) // class, hint, answer
//	e := retry.ClassifyFrame(event, afterOutput)          // an error or response.failed event
//	e = retry.ClassifyUpgrade(status, retryAfterHeader)   // an upgrade refused with a status
//	e = retry.CredentialFailure(err, "")                  // a credential that cannot be had
//	e = retry.Answer(header, e, retry.Facts{Wait: w}, rnd) // retry-after, x-should-retry
//	body := retry.ErrorBody(e)                            // {"type":"error","error":{…}}
//
// Classify reads any error an attempt meets: a failed response (an *UpstreamError), the
// pacer's refusal, an upstream known to be down (*DownError), a credential that cannot be
// had, a refused upgrade or a dial that opened no socket (package upstream's errors), a
// failed socket. The other packages' errors are read by what they say of themselves (a
// PacerRefusal, LoginRequired, Unavailable or AllLimited method), so nothing here imports
// them. The frame table (docs/errors.md §2 and §4) maps the backend's error codes, then its
// error types, to a status and an Anthropic error type; the messages are in our own words.
//
// # The schedule
//
// Retry r (1-based; the budget's MaxRetries of them at most) waits, by the failure's Class:
//
//   - Backoff: the ladder rung, 2 s × 2^(r−1) (pacing.Rung): attempts at 0, 2, 6, 14, 30, 62 s.
//   - Throttled: max(rung, min(hint, 60 s)) × (1 + U[0, 0.25)).
//   - Refused: exactly the refusal's hint (floored at 1 s, capped at 60 s), with no rung and no
//     jitter, because the pacer's wait bound is derived assuming this substitution.
//   - Replace: no wait and no retry spent: the next attempt runs at once on a new socket with the
//     full context. Each budgeted attempt has at most one replacement; a Replace failure of the
//     replacement itself is treated as Backoff.
//   - Fatal: no retry.
//
// Backoff and Throttled failures are the ones a client retries itself. With a Health
// (Config.Health) Do retries them at most HealthConfig.FailureRetries times (default 1) while
// the upstream is healthy and not at all while it is failing, so a persistent failure reaches
// the client after one short wait instead of the whole ladder, and two retry loops (the data
// plane's and the client's) no longer multiply. The budget's MaxRetries stays the cap and the
// pacer's wait bound is derived from it unchanged: Refused and Replace keep every retry.
//
// # Failure memory
//
// Health remembers, across requests, whether each upstream is failing, since when and why.
// While an upstream is unreachable (no socket opened: refused, DNS, TLS, timeout, an upgrade
// 5xx), Health.Dial refuses new sockets at once with a *DownError until the next probe is
// due, a quarter of the failing time after the latest failure (1 s to 15 s); one request then
// dials as the probe. Health.RetryAfter is that wait, what a client is told to wait for a
// failure that carries no hint of its own.
//
// # Deadlines
//
// Every attempt of a request shares one no-data deadline (Deadline, Budget.IdleTimeout) that
// starts when Do starts and is pushed back only by Deadline.Reset, which the attempt calls on
// every upstream stream event; waits between attempts do not reset it. A total deadline
// (Budget.TotalTimeout) caps the whole request. When either expires the attempt's context is
// cancelled with a *TimeoutError cause and Do returns that error. A wait that would reach
// either deadline is not started: Do returns the last classified failure instead, never a bare
// "deadline exceeded" that hides why.
//
// # What the client is told
//
// Answer sets the headers of an error answer and completes its message. Every failure a retry
// can fix (408, 409, 429, 5xx, a usage limit resetting within 60 s) gets "x-should-retry:
// true" and a retry-after drawn by RetryAfterHeader uniformly from [h, ceil(1.25 h)] whole
// seconds — h being the failure's own hint (a usage limit's reset, a 429's hint) or else
// Facts.Wait (Health.RetryAfter) — so clients pace their retries and do not retry in a herd;
// its message ends with "; retry after Ns". ShouldRetry sends "x-should-retry: false" only for
// outcomes a retry cannot fix: a usage limit resetting more than 60 s from now or at an
// unknown time, a context overflow, an auth failure after a refresh. A usage limit is never
// retried inside the data plane (Classify makes it Fatal).
package retry
