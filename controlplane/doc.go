// Package controlplane is the control plane's gRPC server: admission of
// new upstream sockets, per-account policy, health and reflection.
//
// New builds a Server from Options; Serve runs it on a listener until its
// context ends, then shuts down in order (health NOT_SERVING, close
// long-lived streams with a reason, GracefulStop bounded by
// Options.ShutdownGrace, then Stop).
//
// Services (proto/clodex/controlplane/v1):
//
//   - AdmissionService: Admit runs the account's bucket once (created with
//     the default policy on first use, for a registered account) and returns the decision, the wait
//     or retry-after, and the policy version it was decided under. Cancel
//     refunds a still-pending reservation exactly once.
//   - AdminService: SetRate, SetBudget, SetAdaptive, GetAccount,
//     ListAccounts, ListAgents. Values out of range are InvalidArgument
//     naming the allowed range; nothing is clamped. SetBudget with an idle
//     timeout the current retries no longer fit lowers them to the largest
//     whose backoff ladder fits; an explicit max_retries that does not fit
//     is refused, naming that largest. Accounts carry the configured
//     rate_per_minute and the effective_rate_per_minute the bucket paces
//     at; GetAccount and ListAccounts say which store served them
//     (StoreInfo).
//   - AgentService: Connect is each data plane's stream. The agent sends a
//     hello (id, host, version, capability version, account keys), then
//     heartbeats (every 5 s), upstream 403 reports and a goodbye. The
//     server pushes each of the agent's accounts' policy on connect, on
//     every change (SetRate, SetBudget, SetAdaptive, an adaptive step)
//     and whenever the account's live agent count changes; pushes are
//     coalesced per stream and sent at once. The live count is
//     fleet-wide: every replica registers its agents in the store's agent
//     directory (AgentCounter; for Redis a hash per account whose
//     entries lapse 15 s after the last heartbeat) and counts the
//     directory, so an agent's local share divides the account among the
//     agents of every replica; the fleet loop re-reads the counts every
//     tick and re-pushes those that changed through another replica. An agent is live for
//     AgentLiveWindow (15 s) after its last hello or heartbeat while its
//     stream is open; the fleet loop (every Options.FleetTick) closes
//     the streams of silent agents. On shutdown every stream gets an
//     AgentClose with ShutdownReason and ends with Unavailable, through
//     the OnShutdown hook, before GracefulStop.
//   - Adaptive mode, the learned upgrade throttle (per account, stored
//     with the policy, on by default): an upstream 403 reported by any
//     agent pauses the account's admissions until its retry-after, or a
//     learned interval, has passed (PolicyPush.paused_until_unix_ms), and
//     halves the effective rate at most once per 10 s; each 30 s without
//     one raises it by max(1, configured / 10), never above the
//     configured rate. The fleet loop applies raises and pushes them
//     (store.DefaultAdaptive, docs/pacing.md §9).
//   - CredentialService (the credential broker, Options.Broker, package
//     broker): GetToken hands a data plane a usable access token for one
//     account, refreshed first (once for the fleet, under the account's
//     lease) when it is due or was rejected upstream; ServedAccounts lists
//     the accounts the caller may serve. AdminService ImportLogin,
//     ListLogins, GetLogin and RemoveLogin manage the sign-ins. Without a
//     broker these answer FailedPrecondition naming --credential-key-file.
//   - BenchService (only with Options.EnableBench): a no-op with Admit's
//     authentication and message sizes, the benchmark's floor.
//   - grpc.health.v1 and server reflection. The service
//     StoreHealthService reports the store: NOT_SERVING while a Redis
//     store is unreachable and this replica admits from its local share
//     (the overall status stays SERVING).
//
// Authentication: every RPC carries "authorization: Bearer <token>", but
// grpc.health.v1.Health, which needs none so that a kubelet or load
// balancer can probe it (it tells only SERVING or NOT_SERVING). The
// admin token may call everything; the agent token may call everything
// but AdminService (PermissionDenied), AgentService included. A missing
// or unknown token is Unauthenticated. Tokens are compared in constant time and never logged.
// Scoped agent credentials (Options.AgentCreds; clodexctl agent create)
// are agent tokens known by their SHA-256 that may act only for the
// accounts they name: Admit, Cancel, ReportGrants, the agent stream's
// hello, heartbeats and 403 reports, and GetToken for any other account
// are PermissionDenied, counted in clodex_controlplane_denied_total and
// logged once per credential; ServedAccounts answers their accounts.
// Every replica reloads them from the store each fleet tick.
// The token is checked from the request headers by the server's
// grpc.InTapHandle, before the stream is created and before a message is
// read, so a caller without a valid token costs no message buffer; the
// interceptors check again. Request messages are capped at
// MaxRecvMsgSize (256 KiB: the largest legitimate request, a ReportGrants
// of 1000 accounts, is about 163 KB) and headers at MaxHeaderListSize;
// a larger message is ResourceExhausted before its body is read.
// ListAccounts and ListAgents answer in pages (page_size, page_token,
// next_page_token).
//
// Accounts come from operators and registered data planes: Admit and
// ReportGrants serve an account an operator configured (a stored policy,
// or the admin token) or a data plane registered (its agent stream's hello
// and heartbeats, the store's agent directory, or an Admit naming its
// agent id); any other is PermissionDenied and gets no bucket. One agent
// credential registers at most Options.MaxAccountsPerCredential accounts
// (ResourceExhausted past it); registrations lapse RegisteredAccountIdle
// after nothing names them.
//
// Denied calls are counted (clodex_controlplane_denied_total by reason and
// caller IP) and logged as "rpc denied": the first after a quiet
// DeniedLogInterval at once, then one line per interval while denials go
// on (the fleet loop logs the last ones), with how many, why and from
// which addresses.
//
// State lives behind small interfaces declared by the code that uses
// them: Admitter (admission.go); PolicyStore, made of PolicyReader and
// PolicyWriter (admin.go), AdaptiveRates (reports.go) and StoreInfo;
// and, each optional, AgentCounter and AgentRoster (directory.go),
// QuotaStore (reports.go) and PolicyWatcher, given in Options.
// controlplane/store.Memory (one process) and redisstore.Store (replicas
// sharing one Redis) implement them; with PolicyChanges (Redis) the
// server hears of the changes other replicas made and pushes them to its
// agents. CapabilityVersion is the protocol version this server
// implements (history in proto/clodex/controlplane/v1/agent.proto).
//
// Metrics (private registry, Options.Registerer):
//
//	clodex_controlplane_admissions_total{decision="admit|wait|refuse"}
//	clodex_controlplane_admission_wait_seconds       histogram of granted waits
//	clodex_controlplane_cancels_total{refunded="true|false"}
//	clodex_controlplane_account_tokens{account}      bucket level, first 100 accounts
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
// A Redis store adds its own (clodex_controlplane_redis_*: call latency by
// operation, errors, breaker state and openings, live replicas, fallback
// admissions and hand-over debits) when given the registerer.
//
// The per-account gauges and counters cover only the first
// MaxTrackedAccounts account keys the server admits (in order of first
// Admit), so their cardinality stays bounded however many accounts exist.
// GetAccount and ListAccounts return the same counters (Account.admits,
// waits, refusals, forbidden_upgrades), counted since the server started.
package controlplane
