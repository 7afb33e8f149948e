// Package redisstore keeps the control plane's state in Redis, shared by
// any number of replicas.
//
//	st, err := redisstore.Open(ctx, redisstore.Options{URL: url, Replica: "cp-1"})
//	go st.Run(ctx)                    // replica registration, Redis's clock, policy notifications, the breaker's probe
//	defer st.Close()
//	a, err := st.Admit(ctx, key, now) // the memory store's API (store.Memory), one Lua script per decision
//	st.WatchPolicies(push)            // push(key) for each policy change another replica made
//	st.WatchAgentCreds(reload)        // reload() for each agent credential or member another replica changed
//	err = st.PutAgent(ctx, s, info)   // the fleet's roster (RemoveAgent, Agents)
//	err = redisstore.Check(ctx, url, timeout) // --check-config: a Redis answers
//
// A *Store has the memory store's API (Admit, Cancel, HandOver,
// UpdatePolicy, SetAdaptive, Report403, Adapt, Account, Accounts, the
// live-agent directory, PutQuota and Quotas, AdmitMember and
// RefundMember, PutUsage and UsageRows), plus the fleet's roster, the
// broker's logins and leases, the scoped agent credentials and the
// members (what broker.Logins, controlplane.AgentCredStore and
// controlplane.MemberStore ask of it). Now is the
// clock decisions are made on (Redis's TIME); Info says whether the store
// is degraded.
//
// The parts, by file: store.go, Open, Check, Close and the store's
// facts; accounts.go, the decisions and the account reads; policy.go,
// policies and adaptive state; run.go, Run, the breaker and this
// replica's local share while it is open; batch.go, concurrent script
// calls sent in one pipeline per round trip; usage.go, the usage ledger
// (a hash per minute and per hour, one script per batch, lua/usage.lua);
// agents.go, quota.go, logins.go, agentcreds.go and members.go, the rest
// of the state; memberbuckets.go, the members' caps; epoch.go, the
// store's epoch and a replica's first contact (an empty store restored
// from Options.Backup, or started new, saying which); ledger.go, the
// durable records this replica holds; heal.go, writing them back when
// Redis lost them (heal), Snapshot and Restore; badrecords.go, records
// that do not decode; persistence.go, whether Redis keeps its data on
// disk; metrics.go, clodex_controlplane_redis_* and _store_*; lua/, the
// scripts, over one hash per account with a time to live (the state
// packed in field 'S'; field 's', the text earlier versions wrote, is
// still read), the bucket, adaptive and pending-reservation rules of
// docs/pacing.md mirrored in integers: prelude.lua, prepended to every
// script but admit.lua, which runs on every Admit and is the same rules
// written out in line.
// storetest's conformance suite runs against this store and against
// store.Memory.
//
// While Redis cannot be reached a breaker opens and Admit answers from
// this replica's share of each policy (docs/operations.md §3); the
// metrics are in docs/operations.md §13. Redis losing data (a restart
// without persistence, a failover to an empty replica, a FLUSHALL) is
// noticed within two ticks by every replica, which writes back what it
// holds, each record at its version, refresh leases and fencing counters
// first (docs/operations.md §8); a record that does not decode affects
// only its own account, and never opens the breaker.
package redisstore
