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
//     the default policy on first use) and returns the decision, the wait
//     or retry-after, and the policy version it was decided under. Cancel
//     refunds a still-pending reservation exactly once.
//   - AdminService: SetRate, SetBudget, GetAccount, ListAccounts. Values
//     out of range are InvalidArgument naming the allowed range; nothing
//     is clamped.
//   - BenchService (only with Options.EnableBench): a no-op with Admit's
//     authentication and message sizes, the benchmark's floor.
//   - grpc.health.v1 and server reflection.
//
// Authentication: every RPC carries "authorization: Bearer <token>". The
// admin token may call everything; the agent token may call everything
// but AdminService (PermissionDenied). A missing or unknown token is
// Unauthenticated. Tokens are compared in constant time and never logged.
//
// State lives behind two small interfaces declared here, Admitter and
// PolicyStore; controlplane/store.Memory implements both.
//
// Metrics (private registry, Options.Registerer):
//
//	clodex_controlplane_admissions_total{decision="admit|wait|refuse"}
//	clodex_controlplane_admission_wait_seconds       histogram of granted waits
//	clodex_controlplane_cancels_total{refunded="true|false"}
//	clodex_controlplane_account_tokens{account}      bucket level, first 100 accounts
//	clodex_controlplane_account_rate_per_minute{account}
//
// The per-account gauges cover only the first MaxTrackedAccounts account
// keys the server admits (in order of first Admit), so their cardinality
// stays bounded however many accounts exist.
package controlplane
