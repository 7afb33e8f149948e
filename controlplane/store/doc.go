// Package store keeps the control plane's per-account state: one pacing
// bucket per account key, and the per-account policy that survives a
// restart. Store is what the control plane needs; Memory serves one
// process and Redis serves any number of replicas. One conformance suite
// runs against both.
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
// Adaptive mode (SetAdaptive, stored with the policy; DefaultAdaptive, on,
// for an account that never set it) learns the backend's upgrade
// throttle from upstream 403s. Report403 pauses the account until the
// 403's retry-after has passed, or for a learned interval without one
// (AdaptivePause, doubled up to AdaptiveMaxPause by a 403 that follows a
// pause within it); while paused, Admit waits when the pause ends within
// the wait bound (or the policy cannot refuse) and otherwise refuses with
// the pause's end as its hint, debiting nothing. Report403 also lowers
// the effective rate to max(1, floor(0.5 × effective)) at most once per
// AdaptiveLowerEvery, and each AdaptiveRaiseEvery without a 403 (counted
// from the pause's end) raises it by max(1, configured / 10), never above
// the configured rate (Adapt, or any read, applies the raises due).
// Account.Policy is always the configured policy; EffectiveRate is what
// the bucket paces at, PausedUntil the pause's end. Neither is persisted.
//
// HandOver debits grants made elsewhere during an outage (a data plane's
// local share, or a Redis replica's) as if they had been admitted now,
// stopping where the bucket would refuse; a report id is applied once.
//
// Redis keeps the same state in Redis: every decision is one Lua script
// (lua/) over one hash per account with a time to live (its state packed
// in one field, pending reservations in others), the bucket,
// adaptive and pending-reservation rules mirrored in integers below 2^53
// (instants in microseconds, Redis TIME's resolution; tokens in units of
// 1/60e9). Policies live in one hash with a store-wide version; every
// change is published, and WatchPolicies delivers other replicas'
// changes. Admits that arrive together leave together (auto-pipelining):
// while one EVALSHA pipeline is in flight the calls that arrive wait, and
// the next carries them all, so under load a round trip, its syscalls and
// Redis's wake-up are shared by the batch. Decisions use Redis's clock:
// TIME, re-read every tick and advanced by the local monotonic clock in
// between, so all replicas share one clock (an injected clock replaces it
// in tests). Every Redis call
// has a hard deadline; consecutive failures open a breaker, and while it
// is open Admit answers from a local bucket with this replica's share of
// the last known policy (live replicas register in Redis; each outage
// starts with an empty bucket refilling at the share's rate), policy changes
// fail with ErrUnavailable, and a probe every 250 ms closes the breaker
// and hands the local grants over when Redis answers. A call that timed
// out may still run when Redis recovers; it then counts twice, which errs
// toward fewer admissions.
//
// TouchAgent, DropAgent and LiveAgents are the agent directory: which
// agent streams serve which accounts, live until a given instant, so the
// live count a control plane pushes covers every replica. Memory keeps it
// in memory; Redis keeps one hash per account (agent id -> until and
// stream nonce, with a time to live), so a replica that dies leaves its
// agents counted only until their liveness lapses, and an agent that
// moved to another replica is not forgotten when the old stream is
// dropped.
//
// Logins and AgentCreds keep the credential broker's state
// (controlplane/broker): each account's sign-in, sealed by the broker
// before it reaches a store, with a generation every write checks, and a
// per-account refresh lease; and the scoped agent credentials (token
// digests and their accounts). LoginFile keeps both in the data dir's
// logins.json (atomic writes, mode 0600, a lock file around every
// read-modify-write) with lock files as leases; Redis keeps a hash per
// login, a lease key set NX PX whose value is a fencing token from a
// counter (a write under a lease another holder has taken since is
// ErrFenced), and one hash of credentials.
//
// redistest starts a real redis-server for tests.
package store
