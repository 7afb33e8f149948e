// Package controlplane is the control plane's gRPC server: admission of
// new upstream sockets, per-account policy, the data planes' agent
// streams, the credential broker's service, health and reflection.
//
//	st, err := store.Open(store.Options{Dir: dataDir})  // or redisstore.Open for replicas over Redis
//	srv, err := controlplane.New(controlplane.Options{Admissions: st, Policies: st, Agents: st, Quotas: st, Usage: st,
//		AdminToken: admin, AgentToken: agent, Broker: b, Logger: logger, Registerer: reg})
//	srv.OnShutdown(closeStreams)   // runs with ShutdownReason before GracefulStop
//	err = srv.Serve(ctx, lis)      // until ctx ends, then the shutdown order below
//
// Serve runs the server on a listener until its context ends, then shuts
// down in order: health NOT_SERVING, Options.DrainDelay, the OnShutdown
// hooks, GracefulStop bounded by Options.ShutdownGrace, then Stop. While
// serving, the fleet loop (fleet.go, every Options.FleetTick) expires
// silent agents, re-reads the fleet's live counts and applies adaptive
// raises.
//
// The state comes from the stores in Options, each seen through a small
// interface its consumer declares: Admitter (admission.go); PolicyStore,
// made of PolicyReader and PolicyWriter (admin.go), AdaptiveRates
// (reports.go) and StoreInfo; and, optional, AgentCounter and AgentRoster
// (directory.go), QuotaStore (reports.go), UsageLedger (usage.go),
// PolicyWatcher, AgentCredStore (scope.go), AgentCredWatcher (revoke.go),
// MemberStore and MemberBuckets (members.go) and DurableStore (backup.go).
// store.Memory (one process) and
// redisstore.Store (replicas sharing one Redis) implement them; the data
// directory's store.LoginFile keeps the agent credentials without Redis.
//
// The services (proto/clodex/controlplane/v1), by file:
//
//   - admission.go: AdmissionService (Admit, Cancel, ReportGrants), and
//     BenchService's no-op floor with Options.EnableBench.
//   - admin.go: AdminService's policy and listing RPCs; scope.go its
//     scoped agent credentials, revoke.go their revocation (the streams
//     of a removed credential closed on every replica); members.go the
//     team's members (CreateMember, ListMembers, RemoveMember), pushed to
//     every agent that takes them, and a member's cap, which Admit takes
//     before the account's bucket;
//     credentials.go CredentialService and the login RPCs, served by
//     Options.Broker; backup.go Backup and Restore, a backup file of the
//     store's durable state in chunks, served by Options.Durable and
//     sealed with Options.BackupSealer.
//   - stream.go: AgentService.Connect, each data plane's stream (hello,
//     heartbeats, goodbye, coalesced policy pushes with the fleet-wide
//     live count, CapabilityHeader); reports.go the 403 and plan-usage
//     reports it carries; usage.go the usage reports (stored, then
//     acknowledged) and AdminService.GetUsage, usagemetrics.go their
//     counters; quotaview.go the fleet's plan usage, pushed to the agents
//     serving each account, and the burn rates ListQuotas answers.
//   - directory.go: the agent directory, the one answer to who is
//     connected where: this replica's streams, and through Options.Agents
//     and Options.Roster every replica's.
//   - auth.go, accounts.go, denials.go: bearer tokens (checked from the
//     headers before a message is read), the accounts data planes
//     registered, and the counted, rate-limited log of denied calls;
//     recvlimits.go each method's receive limit, checked before a
//     message is decoded; errors.go maps errors to gRPC status;
//     metrics.go the metrics.
//   - server.go: New, Serve, grpc.health.v1 (whose StoreHealthService
//     reports the store) and reflection.
//
// CapabilityVersion is the protocol version this server implements
// (history in proto/clodex/controlplane/v1/agent.proto); AgentLiveWindow,
// MaxRecvMsgSize, MaxHeaderListSize and KeepaliveEnforcement are its
// limits. The behaviour is specified in docs/pacing.md §7 (admission),
// §8.1 (hand-overs), §9 (adaptive mode) and §10 (the agent stream), and
// in docs/operations.md §3 (replicas), §8 (backups and what survives
// what), §10 (health), §11 (authentication and limits), §13 (metrics),
// §15 (members) and §16 (usage and the fleet's plan usage), and
// docs/credentials.md §10 (members, pins and caps). A record the store cannot decode is FailedPrecondition
// naming it (errors.go), never Internal.
package controlplane
