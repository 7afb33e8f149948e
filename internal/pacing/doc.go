// Package pacing is the token bucket and request-budget math that paces new upstream
// connections for one account. It is shared by the control plane (which owns the buckets) and
// the data plane (which falls back to a local bucket when the control plane is away).
//
// The package is pure: every method takes the instant it should use (now time.Time, as
// x/time/rate's AllowN does), nothing calls time.Now, there is no I/O and no goroutine, and
// the environment is read only through the lookup function handed to PolicyFromEnv.
//
// # What it buys and what it costs
//
// Pacing lowers the chance that a burst of parallel agents trips the provider's limit on new
// connections. It is a reduction in risk, not a guarantee: the 60/minute default is a
// conservative reading of one account's traffic, not a published limit, and under a heavy
// enough fan-out the pacer itself answers with a retryable refusal.
//
// Pacing is a throughput ceiling, not a brief pause. At one new connection per second, about
// twenty agents settle at roughly twenty seconds per turn instead of a few seconds. Only work
// that needs a brand-new connection asks the bucket; reusing a connection never does.
//
// # The bucket
//
// A Bucket holds Burst tokens (default 10) and refills RatePerMinute of them a minute
// (default 60). Take decides one request at now, with refill r and floor F = −bound × r:
//
//   - tokens ≥ 1: admit now and debit one token (KindAdmit);
//   - otherwise the request would wait w = (1 − tokens)/r; if w ≤ bound, admit after w and
//     debit (KindWait);
//   - otherwise, if the policy can refuse, refuse with a retry-after hint and debit nothing
//     (KindRefuse);
//   - otherwise, if tokens > F, admit after exactly the bound and debit;
//   - otherwise admit now without a debit, past the ceiling (Decision.Relaxed).
//
// A refusal never debits. That is the load-bearing detail: a refused request opens no
// connection and will be retried, so charging it would let every retry deepen the deficit
// that refused it. Because only admissions within the bound debit, tokens never fall below F
// when the policy can refuse (and never to F − 1 when it cannot): the queue is bounded by
// construction. Admissions are FIFO, with departures 1/rate apart; a cancelled reservation
// gives its token back (RefundReservation, once per reservation), without rescheduling the
// reservations queued behind it. Arithmetic is exact (integer tokens × 60e9, so one
// nanosecond refills exactly RatePerMinute units); waits are reported rounded up to whole
// milliseconds.
//
// Sustained output follows the rate, not the offered load: at 82 requests a minute offered
// against 60/minute, the fourth minute admits 60. The first design admitted anyway once the
// bound expired; it read 82, a limiter that did not limit plus the bound's latency.
//
// # The derived wait bound
//
// The wait bound is derived, not chosen. Every attempt of one request shares one no-data
// deadline (the idle timeout), so the whole retry ladder must fit inside it:
//
//	bound = min(15000, floor((idle − Ladder(retries)) / 2 / (retries + 1))) ms
//
// where Ladder(r) = 2000 × (2^r − 1) ms is the retry loop's backoff (dataplane/retry).
// ResolveBudget clamps the idle
// timeout to 10s..3600s, lets only an explicitly set total timeout below it lower it, clamps
// retries to 10 and then lowers them until the ladder is strictly shorter than the idle
// timeout. At the defaults (120s, 5 retries) the bound is 4833ms. Where the ladder leaves no
// room (IDLE=14001 gives 0), pacing turns itself off with a notice: it degrades to less
// pacing, never to a request pushed past its deadline.
//
// # The refusal rule and the hint
//
// A refusal's retry-after is Budget.Hint: max(1, floor(bound/1000)) whole seconds. The retry
// loop spends the hint instead of its backoff rung, so the hint is capped at the bound — a
// hint sized to the deficit would replace the very term the bound was derived against and
// spend the whole deadline on one sleep. The one-second floor exists because zero would mean
// "retry immediately". The true deficit is still reported in Decision.RequiredWait.
//
// The bucket refuses only when its retry schedule can outlast the wait for a free slot:
// Policy.CanRefuse is retries > 0, bound > 0 and retries × hint_s × 1000 ≥ 60000 / rate. At
// the default budget that means 3/minute and above; at IDLE=10000, 30/minute and above.
// Below that, refusing would manufacture the very rate-limit errors pacing exists to avoid
// (at 1/minute all six attempts would be spent inside twenty seconds), so the bucket shapes
// the opening burst and then admits the overflow, with a one-time notice. What gives way is
// the configured ceiling, not latency: at 1/minute, 20 simultaneous requests see 10 admitted
// at once, one after the bound, and 9 more at once, past the ceiling.
//
// # Configuration and notices
//
// PolicyFromEnv reads CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN and the three budget variables:
// trimmed decimal integers only; negative, fractional or non-numeric values are ignored with
// a notice; a rate above 600 clamps to 600 with a notice; only a literal 0 disables pacing.
// Notices are one-time (Notices deduplicates by Key) and their keys are namespaced, so no
// configured value can suppress the "pacing disabled" notice. The admin path never clamps:
// Policy.Validate, ValidateRate and ValidateBurst return a *RangeError naming the field and
// the allowed range.
package pacing
