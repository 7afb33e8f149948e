// Package store keeps the control plane's per-account state in one
// process, and defines the values every store shares.
//
//   - Open returns a *Memory: one pacing bucket per account key, sharded so
//     concurrent Admits over many accounts do not share a lock; Admit,
//     Cancel and HandOver decide; UpdatePolicy, SetAdaptive, Report403
//     and Adapt change policy and adaptive state; Account and Accounts
//     read; TouchAgent, DropAgent and LiveAgents are the live-agent
//     directory; PutQuota and Quotas keep plan usage; Run forgets idle
//     accounts. With Options.Dir custom policies persist to policy.json
//     (atomic writes, mode 0600), loaded by Open; bucket levels do not.
//   - OpenLogins returns a *LoginFile: the credential broker's logins and
//     the scoped agent credentials in the data dir's logins.json, with
//     lock files as leases (what broker.Logins and
//     controlplane.AgentCredStore ask of it; NewLease is for stores).
//   - Shared values: Admission, Account, HandOverResult, Info, Quota and
//     QuotaWindow (Quota.Merge is how every store applies a report),
//     AgentStream and AgentInfo, Login, Lease and AgentCred; the errors
//     ErrNotFound, ErrUnavailable, ErrConflict, ErrFenced and WriteError;
//     ValidateKey and CheckDir.
//
// The rules are docs/pacing.md §3 (the bucket), §8.1 (hand-overs) and §9
// (adaptive mode). redisstore keeps the same state in Redis for replicas;
// storetest is the conformance suite both stores run; redistest starts a
// real redis-server for tests.
package store
