// Package pacing is the token bucket and request-budget math that paces
// new upstream connections for one account, shared by the control plane
// (which owns the buckets) and the data plane (which falls back to a local
// bucket while the control plane is away).
//
//	pol, notices := pacing.PolicyFromEnv(os.LookupEnv)  // rate, burst and budget; notices say what was adjusted
//	b := pacing.NewBucket(pol, now)
//	d := b.Take(now)                  // KindAdmit, KindWait (d.Wait) or KindRefuse (d.RetryAfter)
//	b.RefundReservation(now, d.ID)    // a waiting request gave up
//	b.SetPolicy(now, newPolicy)       // a policy change keeps the level
//	budget, notices := pacing.ResolveBudget(in) // idle/total timeouts, retries, the derived wait bound
//	hint := budget.Hint()             // a refusal's retry-after
//	err := pol.Validate()             // the admin path: a *RangeError, never clamped
//
// The package is pure: every method takes the instant it should use (now
// time.Time, as x/time/rate's AllowN does), nothing calls time.Now, there
// is no I/O and no goroutine, and the environment is read only through the
// lookup function handed to PolicyFromEnv.
//
// The parts, by file: bucket.go, [Bucket] and its [Decision]s ([State]
// and [Restore] carry a level across processes); budget.go, [Budget],
// [ResolveBudget], the retry ladder ([Ladder], [Rung]) and the wait bound
// ([WaitBoundFor]); policy.go, [Policy] with [Policy.CanRefuse] and its
// notices; env.go, [PolicyFromEnv]; notice.go, one-time [Notice]s
// deduplicated by key ([Notices]).
//
// The behaviour is specified in docs/pacing.md: the request budget and
// the ladder (§1), the derived wait bound with worked rows (§2), the
// bucket (§3), when it refuses and the hint (§4), the low-rate fallback
// (§5) and when pacing is off (§6).
package pacing
