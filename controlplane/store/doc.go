// Package store keeps the control plane's per-account state: one pacing
// bucket per account key, and the per-account policy that survives a
// restart.
//
// Memory is the default store: buckets live in memory, sharded so many
// concurrent Admit calls over many accounts do not serialize on one lock,
// and custom policies persist to a JSON file (policy.json under the data
// directory) written atomically (temp file, fsync, rename; mode 0600) on
// every change and loaded by Open.
//
// Every policy change increments a store-wide version, recorded on the
// account it changed; Admission.PolicyVersion reports the version the
// decision was made under (0 for the default policy). Bucket levels are
// not persisted: after a restart every bucket starts full.
//
// Memory.Run sweeps accounts that are indistinguishable from new ones (no
// stored policy, nothing pending, a full bucket, idle for 10 minutes), so
// memory follows the accounts in use rather than every key ever seen.
//
// Adaptive mode (SetAdaptive, stored with the policy) paces an account
// below its configured rate after upstream 403s: Report403 lowers the
// effective rate to max(1, floor(0.7 × effective)) at most once per 10 s,
// and each full minute without a 403 raises it by max(1, configured / 10),
// never above the configured rate (Adapt, or any read, applies the raises
// due). Account.Policy is always the configured policy; EffectiveRate is
// what the bucket paces at. The effective rate is not persisted.
//
// The server consumes the store through small interfaces it declares, so
// a shared store (Redis, with the bucket math in a script) can replace
// Memory for several replicas.
package store
