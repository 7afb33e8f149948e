// Package redisstore keeps the control plane's state in Redis, shared by
// any number of replicas.
//
//   - Open returns a *Store with the memory store's API (store.Memory):
//     Admit, Cancel, HandOver, UpdatePolicy, SetAdaptive, Report403,
//     Adapt, Account, Accounts, the live-agent directory (TouchAgent,
//     DropAgent, LiveAgents) and PutQuota and Quotas; Run keeps it current
//     (replica registration, Redis's clock, policy notifications, the
//     breaker's probe); Close releases it.
//   - The fleet's roster (PutAgent, RemoveAgent, Agents): every replica's
//     agents with what clodexctl agents lists of them.
//   - WatchPolicies delivers the policy changes other replicas made.
//   - The broker's logins and leases and the scoped agent credentials
//     (broker.Logins, controlplane.AgentCredStore).
//   - Now is the clock decisions are made on (Redis's TIME); Info says
//     whether the store is degraded; Check proves a Redis answers.
//
// Every decision is one Lua script (lua/) over one hash per account with
// a time to live, the bucket, adaptive and pending-reservation rules of
// docs/pacing.md mirrored in integers; storetest's conformance suite runs
// against it and against store.Memory. While Redis cannot be reached a
// breaker opens and Admit answers from this replica's share of each
// policy (docs/operations.md §3).
package redisstore
