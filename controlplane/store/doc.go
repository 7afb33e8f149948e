// Package store keeps the control plane's per-account state in one
// process, and defines the values every store shares.
//
//	m, err := store.Open(store.Options{Dir: dataDir}) // policies persist to policy.json; buckets do not
//	go m.Run(ctx)                                     // forgets idle accounts
//	a, err := m.Admit(ctx, key, now)                  // one bucket decision (and Cancel, HandOver)
//	acct, err := m.UpdatePolicy(ctx, key, now, update) // SetAdaptive, Report403, Adapt: policy and adaptive state
//	l, err := store.OpenLogins(dataDir)               // the broker's logins, the scoped agent credentials, the members
//	snap, err := store.DirState{Policies: m, Logins: l}.Snapshot(ctx) // the durable state; Restore puts one back
//	b, err := store.OpenBackupDir(store.BackupOptions{Dir: dir, Sealer: key.BackupSealer()})
//	go b.Run(ctx, src, changes, changed)              // a sealed backup after every durable change, rotated
//
// The parts, by file: memory.go, the [Memory] store (one pacing bucket
// per account key, sharded so concurrent Admits over many accounts do not
// share a lock; decisions, policies, reads, the sweep) with [Admission]
// and [Account]; adaptive.go, the learned upgrade throttle; agents.go, the
// live-agent directory (TouchAgent, DropAgent, LiveAgents) and the agent
// values; quota.go, plan usage ([Quota], [QuotaWindow]; Quota.Merge is
// how every store applies a report); usage.go, the usage ledger
// ([UsageBatch], [UsageRow], PutUsage once per batch, UsageRows, the
// retention and the rows cap of a minute) and usagejournal.go its files
// in the data dir ([UsageDir]: a synced journal per day, compacted, then
// deleted); file.go, policy.json (atomic writes,
// mode 0600); logins.go and agentcreds.go, the [LoginFile] with lock files
// as leases ([Login], [Lease], [NewLease], [AgentCred]); member.go, the
// team's members in the same file ([Member], [ValidateMemberName]);
// memberbuckets.go, each member's cap ([MemberPolicy], AdmitMember,
// RefundMember); lastgood.go, the
// last good copy (FILE.bak) each data-dir file keeps and takes back when
// the file does not decode ([Recovery]); snapshot.go, the durable state
// as a [Snapshot] and its backup file ([EncodeBackup], [DecodeBackup],
// [Sealer], [RestoreOptions]); backups.go, the [BackupDir] of
// --backup-dir; durable.go, [DirState], the data dir's snapshots and
// restores; datadir.go, [CheckDir] and [WriteError]; key.go,
// [ValidateKey]; store.go, what every store shares ([HandOverResult],
// [Info], [ErrUnavailable], [BadRecordError]).
//
// The rules are docs/pacing.md §3 (the bucket), §7 (the policy and its
// persistence), §8.1 (hand-overs) and §9 (adaptive mode); what survives
// what is docs/operations.md §8, the usage ledger §15. Package
// redisstore keeps the same state in Redis for replicas; storetest is the
// conformance suite both stores run; redistest starts a real redis-server
// for tests.
package store
