// Package control is the data plane's one client of the control plane: one
// gRPC connection carrying admission (with a local fallback while the
// control plane cannot be reached), the agent stream (policy in, reports
// out) and, for a data plane without an auth.json, the broker's tokens.
//
//	c, err := control.New(control.Config{Target: addr, Token: tok, AgentID: control.NewID(host, pid),
//		Fallback: envPolicy, Budgets: budgets, Accounts: keys, Notify: notify, Logger: logger})
//	go c.Run(ctx)                          // agent stream, hand-over, broker tokens; says goodbye when ctx ends
//	err = c.Admit(ctx, key)                // before each new upstream socket: nil, *RefusedError or ctx.Err()
//	c.Report403(key, retryAfter)           // an upgrade the upstream refused
//	c.ReportRateLimits(rl)                 // an account's plan usage
//	c.ReportUsage(row)                     // a turn's usage, for the ledger
//	rl, ok := c.FleetLimits(key)           // the fleet's plan usage of an account, as pushed
//	keys, err := c.Accounts(ctx)           // the accounts served (broker: learned)
//	cred, err := c.Credential(ctx, key)    // broker: a token per turn
//	cred, err = c.Rejected(ctx, key, tok)  // broker: after an upstream 401, one forced refresh
//	c.Mode(); c.Reachable()                // the one view of the control plane
//	err = c.Accepted(ctx)                  // at start: the agent token accepted, refused, or the control plane unreachable
//	err = c.Refused()                      // before every turn: an *AgentRefusedError while the control plane refuses it
//	c.Close()                              // after Run returned: closes the connection
//
// The parts, by file:
//
//   - control.go: [Config], [New], [Client.Run] (which owns the agent
//     stream, the hand-over loop and, with Config.Broker, the token loop)
//     and [Client.Close];
//     [NewID] and [ValidateID] make and check agent ids.
//   - target.go: [ParseControlPlanes] reads a --control-plane value
//     (internal/cptarget, which clodexctl shares); the
//     connection's options (round robin over the replicas whose
//     [StoreHealthService] is SERVING, an Admit retried on another replica,
//     [Keepalive]). The embedded control plane is reached the same way,
//     through Config.Dialer.
//   - shares.go: the second connection, over the replicas whose
//     [AdmissionHealthService] is SERVING, which every RPC uses while no
//     replica reaches the store (each then decides from its share);
//   - admit.go: [Client.Admit], central or from a local bucket holding this
//     host's share of the account's policy (the route, and which Admit of
//     a local client is the probe), and the admission attributes it sets
//     on the caller's span; errors.go: [RefusedError], [ErrInvalidKey],
//     [ErrClosed].
//   - refused.go: [Client.Refused] and [Client.Accepted]: a control plane
//     that answers Unauthenticated (a revoked credential, a wrong token)
//     refuses the data plane, which then serves no turn
//     ([AgentRefusedError]) until the agent stream is accepted again.
//   - reachable.go: [Client.Mode] and [Client.Reachable], the one notion
//     of the control plane reachable, what switches it and the probes'
//     backoff; handover.go: the tally of local grants and its
//     ReportGrants.
//   - stream.go: the AgentService.Connect stream (hello, heartbeats,
//     policy pushes with their live counts, goodbye); reports.go: the
//     queued 403 and plan-usage reports it carries; members.go: the
//     member pushes it carries, into Config.Members. Admit names the
//     turn's member (accounts.MemberFrom): its cap comes before the
//     account's, centrally and in the local fallback; usage.go: the
//     turns' usage, per minute, in numbered batches kept until
//     acknowledged (sent again after a reconnect), and the fleet's quota
//     pushes.
//   - tokens.go: [Client.Accounts], [Client.Credential] and
//     [Client.Rejected] from the broker's CredentialService, kept fresh
//     by Run. Their errors are package accounts' ([*accounts.UnavailableError],
//     [*accounts.LoginRequiredError]).
//
// The behaviour is specified in docs/pacing.md: §7 (fleet admission and
// the connection), §8 (the local fallback and its probes), §8.1 (the
// hand-over), §8.2 (one view of the control plane), §9 (the pause the
// pushes carry) and §10 (the agent stream); usage in docs/operations.md
// §15; the broker's tokens in
// docs/credentials.md §8; the spans in docs/operations.md §9. Nothing
// here logs or returns a token or a raw account id; of the control
// plane's packages only the generated API is imported (deps_test.go).
package control
