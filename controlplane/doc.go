// Package controlplane is the control plane's gRPC server: admission of
// new upstream sockets, per-account policy, the data planes' agent
// streams, the credential broker's service, health and reflection.
//
// New builds a *Server from Options; Serve runs it on a listener until
// its context ends, then shuts down in order (health NOT_SERVING, the
// drain delay, the OnShutdown hooks that close long-lived streams with
// ShutdownReason, GracefulStop bounded by Options.ShutdownGrace, then
// Stop). While serving, the fleet loop (fleet.go, every
// Options.FleetTick) expires silent agents, re-reads the fleet's live
// counts and applies adaptive raises.
//
// The state comes from the stores in Options, each seen through a small
// interface its consumer declares: Admitter (admission.go); PolicyStore,
// made of PolicyReader and PolicyWriter (admin.go), AdaptiveRates
// (reports.go) and StoreInfo; and, optional, AgentCounter and
// AgentRoster (directory.go), QuotaStore (reports.go), PolicyWatcher and
// AgentCredStore (scope.go). controlplane/store.Memory (one process) and
// redisstore.Store (replicas sharing one Redis) implement them; the data
// directory's store.LoginFile keeps the agent credentials without Redis.
//
// The services (proto/clodex/controlplane/v1), by file:
//
//   - admission.go: AdmissionService (Admit, Cancel, ReportGrants), and
//     BenchService's no-op floor with Options.EnableBench.
//   - admin.go: AdminService's policy and listing RPCs (ListAgents reads
//     the agent directory, ListQuotas the QuotaStore); scope.go its
//     scoped agent credentials; credentials.go CredentialService and the
//     login RPCs, served by Options.Broker.
//   - stream.go: AgentService.Connect, each data plane's stream: hello,
//     heartbeats, goodbye, and the policy pushes (coalesced per stream,
//     carrying the account's fleet-wide live count); reports.go the 403
//     and plan-usage reports it carries.
//   - directory.go: the agent directory, the one answer to who is
//     connected where: this replica's streams, and through Options.Agents
//     and Options.Roster every replica's.
//   - auth.go, accounts.go, denials.go: bearer tokens (checked from the
//     headers before a message is read), the accounts data planes
//     registered (RegisteredAccountIdle, MaxAccountsPerCredential), and
//     the counted, rate-limited log of denied calls; errors.go maps
//     errors to gRPC status.
//   - grpc.health.v1, whose StoreHealthService reports the store
//     (NOT_SERVING while Redis is unreachable), and reflection.
//
// CapabilityVersion is the protocol version this server implements
// (history in proto/clodex/controlplane/v1/agent.proto); AgentLiveWindow,
// MaxRecvMsgSize, MaxHeaderListSize and KeepaliveEnforcement are its
// limits. The behaviour is specified in docs/pacing.md §7 (admission),
// §8.1 (hand-overs) and §9 (adaptive mode), and in docs/operations.md §3
// (replicas), §10 (health) and §11 (authentication and limits).
//
// Metrics (private registry, Options.Registerer; metrics.go):
//
//	clodex_controlplane_admissions_total{decision="admit|wait|refuse"}
//	clodex_controlplane_admission_wait_seconds       histogram of granted waits
//	clodex_controlplane_cancels_total{refunded="true|false"}
//	clodex_controlplane_account_tokens{account}      bucket level
//	clodex_controlplane_account_rate_per_minute{account}
//	clodex_controlplane_account_effective_rate_per_minute{account}
//	clodex_controlplane_account_admissions_total{account,decision}  this server's decisions
//	clodex_controlplane_account_upstream_403_total{account}         403s reported to it
//	clodex_controlplane_upstream_403_total           403s reported by agents
//	clodex_controlplane_agents                       registered agents
//	clodex_controlplane_handover_debits_total        tokens debited by ReportGrants
//	clodex_controlplane_account_quota_used_percent{account,window}   plan usage agents reported
//	clodex_controlplane_account_quota_resets_at_seconds{account,window} its reset, Unix seconds
//	clodex_controlplane_store_degraded               1 while the store is unreachable
//	clodex_controlplane_denied_total{reason,peer}    refused calls; peer is the caller's IP, first MaxDeniedPeers
//
// The per-account series cover the first MaxTrackedAccounts accounts the
// server admits; GetAccount and ListAccounts return the same counters.
// A Redis store adds its own (clodex_controlplane_redis_*).
package controlplane
