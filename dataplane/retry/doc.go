// Package retry runs the attempts of one upstream request inside its
// budget, remembers across requests which upstream is failing, and holds
// the one failure table: how every upstream failure is classified and
// what the client is told.
//
//	err := retry.Do(ctx, retry.Config{Budget: budgets.For(key), Health: health, Upstream: up, Account: key, Logger: logger},
//		func(ctx context.Context, a retry.Attempt) error {
//			// a.Replacement: a new socket with the full context; a.Previous: the last failure.
//			for { frame := next(ctx); a.Idle.Reset(); ... } // return a *Failure, or Final(err) after output
//		})
//	f := retry.Classify(err, retry.Facts{Reused: lease.Reused, Upstream: up, Now: now}) // class, hint, answer
//	e := retry.ClassifyFrame(event, afterOutput)          // an error or response.failed event
//	e = retry.ClassifyUpgrade(status, retryAfterHeader)   // an upgrade refused with a status
//	e = retry.Answer(header, e, retry.Facts{Wait: w, Now: now}, rnd) // retry-after, x-should-retry, a usage limit's reset, the message's end
//	body := retry.ErrorBody(e)                            // {"type":"error","error":{…}}
//	ticket, err := health.Dial(up)                        // a new socket: gated while the upstream is down
//
// The package is pure: it opens no socket, time comes from an injected
// [Clock] and jitter from an injected random source, so every schedule can
// be asserted exactly. It reads other packages' errors by what they say of
// themselves (a PacerRefusal, LoginRequired, Unavailable or AllLimited
// method), so it imports none of them but package upstream.
//
// The parts, by file:
//
//   - retry.go: [Do], [Config], [Attempt], the classes ([Class]: Backoff,
//     Throttled, Refused, Replace, Fatal) and [Wait], the wait before
//     retry r; the deadlines Do puts every request under ([Deadline], the
//     no-data deadline every attempt shares, reset by each upstream
//     event; the total deadline; the [*TimeoutError] that ends a request)
//     and their [Clock]; [Budgets], each account's budget as the control
//     plane pushed it.
//   - classify.go: [Classify], turning any error an attempt meets into a
//     [*Failure], including whether the attempt's socket is kept
//     (Failure.KeepSocket: [EndsResponse], [KeepsSocket]); [Transport],
//     [Refusal], [CredentialFailure], [Final].
//   - failures.go: [UpstreamError], [ClassifyFrame] and [ClassifyUpgrade]
//     with the backend's codes and types, [Overflow], [FormatWait] and
//     [ErrorBody]; usagelimit.go: a usage limit's reset, its message and
//     the reset-time headers; client.go: [Answer], [ShouldRetry] and
//     [RetryAfterHeader], what the client is told.
//   - health.go: [Health], the failure memory keyed by upstream (and by
//     upstream and account for throttles, [AccountKey]): the failure
//     retries a turn gets, [Health.Dial] and [Health.Down] gating new
//     sockets with a [*DownError], [Health.RetryAfter].
//
// The behaviour is specified in docs/errors.md: refused upgrades (§2.2),
// transport failures (§3), the frame table (§4), the schedule, the failure
// retries, the failure memory and the socket kept for the next attempt
// (§5), 401s (§6) and what the client
// receives (§8); the budget and the ladder in docs/pacing.md §1.
package retry
