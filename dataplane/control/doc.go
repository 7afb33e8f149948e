// Package control is the data plane's one client of the control plane: one
// gRPC connection carrying admission (with a local fallback while the
// control plane cannot be reached), the agent stream (policy in, reports
// out) and, for a data plane without an auth.json, the broker's tokens.
//
//	c, err := control.New(control.Config{Target: addr, Token: tok, AgentID: control.NewID(host, pid),
//		Fallback: envPolicy, Accounts: keys, Notify: notify, Logger: logger})
//	go c.Run(ctx)                          // agent stream, hand-over, broker refresh; says goodbye when ctx ends
//	err = c.Admit(ctx, key)                // before each new upstream socket
//	(pushes of each account's turn budget land in Config.Budgets)
//	c.Report403(key, retryAfter)           // an upgrade the upstream refused
//	c.ReportRateLimits(rl)                 // an account's plan usage
//	keys, err := c.Accounts(ctx)           // the accounts served (broker: learned)
//	cred, err := c.Credential(ctx, key)    // broker: a token per turn
//	cred, err = c.Rejected(ctx, key, tok)  // broker: after an upstream 401, one forced refresh
//	c.Mode(); c.Reachable()                // the one view of the control plane
//	c.Close()                              // after Run returned: closes the connection
//
// Admit's answers:
//
//	var refused *control.RefusedError
//	switch err := c.Admit(ctx, key); {
//	case err == nil: // dial now (any granted delay was already waited out)
//	case errors.As(err, &refused): // retryable: the next attempt waits exactly refused.RetryAfter
//	default: // ctx ended (or a programming error: ErrInvalidKey, ErrClosed)
//	}
//
// ParseControlPlanes checks a --control-plane value; NewID and ValidateID
// make and check agent ids. The embedded control plane is reached the same
// way as a remote one: Config.Dialer opens its in-process listener and
// Config.Target is used as given.
//
// # The connection
//
// New dials lazily (an unreachable control plane is not an error) with the
// agent token on every RPC, TLS when Config.TLS is set, otelgrpc client
// spans from Config.TracerProvider, and one set of options: one connection
// serves every replica a --control-plane value names (host:port, whose name
// may resolve to several replicas; a comma-separated list; or
// dns:///host:port), balancing round robin over the replicas that report
// their store SERVING (StoreHealthService), so a replica that is down,
// draining or cut off from the shared store gets no RPCs. An admission RPC
// that fails with Unavailable (its replica died under it) is tried again on
// another replica within the same deadline, so a replica's death costs no
// request a local decision. Keepalive drops a replica that hangs. The
// connection's reconnect backoff is the probes' (MinBackoff doubling to
// MaxBackoff, ±20 %).
//
// # Central admission
//
// Only a brand-new upstream socket asks. Reusing a head never does, and a
// replacement socket for a request that was already admitted (transport
// retry, previous_response_not_found, websocket_connection_limit_reached)
// is not paced: callers simply do not call Admit for those.
//
// Admit sends one Admit RPC for the account key with a deadline of
// Config.Timeout (250 ms by default) and acts on the answer: ADMIT returns
// nil; WAIT waits out wait_ms inside Admit and returns nil; REFUSE returns a
// *RefusedError whose RetryAfter is the control plane's hint, already capped
// to fit the request budget. A request whose context ends during a wait
// cancels its reservation (a Cancel RPC under a short context detached from
// the request's cancellation) so the token goes back to the bucket, and
// Admit returns ctx.Err(). A request that waited and finds its account
// paused (a 403 elsewhere in the fleet, pushed on the agent stream) gives
// its slot back and is refused until the pause ends (RefusedError.Paused).
//
// # Local fallback
//
// A control plane that does not answer (Unavailable, DeadlineExceeded, any
// transport error) never fails a turn: the request is decided at once by a
// local per-account bucket holding this host's share of the account's
// policy, rate max(1, floor(rate / live)) and burst max(1, ceil(burst /
// live)) with live = LiveAgents(account key) (a rate of 0, pacing off,
// stays 0): the highest count pushed in the last 15 s, so a restarted
// control plane pushing 1, 2, 3 as agents register again does not hand one
// host the whole account. The policy is the last one pushed for the
// account, or Config.Fallback (the environment defaults) for an account
// never pushed; Budget reads the same. The switch is announced once
// through Config.Notify, and Mode reports "local".
//
// Each outage starts with new local buckets holding zero tokens, refilling
// at the share's rate up to the share's burst. The switch follows requests
// the control plane has just admitted from the account's central bucket,
// which this host cannot see; a full local burst on top of them would let
// the fleet open up to a whole extra burst of sockets at once (the upstream
// answers that with 403s). Starting empty costs at most one burst per
// outage and never exceeds the policy.
//
// "Admits locally at once" means: it asks the local bucket at once, without
// waiting for the control plane, and applies the bucket's decision by the
// same rule as the control plane (admit; wait within the derived bound;
// refuse with the hint only when the policy can refuse). The share is this
// host's part of the account's fleet-wide rate, so admitting everything
// unpaced would let N hosts open N times the configured rate. Refusals from
// the local bucket have RefusedError.Local set.
//
// While local, the client goes back to the control plane with jittered
// exponential backoff (250 ms doubling to 2 s, ±20 %): the first Admit
// after the backoff expires asks the control plane again (one such probe at
// a time; concurrent requests keep deciding locally). A probe that answers
// switches back to central admission, uses that answer, and is announced
// once; a probe that fails extends the backoff. A probe costs at most
// Config.Timeout of one request's latency per backoff interval, and only
// while the control plane hangs (a refused connection fails at once).
//
// A control plane that answers with an error of another kind
// (Unauthenticated, PermissionDenied, Internal, ...) is reachable but
// unusable: that request is decided locally too, the error is logged
// (rate-limited) and announced once per code, and the mode stays central so
// the next request asks again.
//
// # Reachable
//
// The client keeps one view of the control plane (Mode, Reachable), which
// admission routes on. An admission RPC that finds it unreachable switches
// it to local; so does an agent stream that cannot be opened, or a broker
// RPC that fails, when the connection has no replica ready (an Unavailable
// from the broker may be its identity provider's, and one replica's stream
// may fail while the others answer). Any answer while local (the agent
// stream connected, the broker answered) is a sign it is back: the next
// Admit asks at once instead of waiting out the backoff, and Run hands the
// outage's grants over and returns to central admission without waiting
// for a request. Each change is announced once.
//
// # Hand-over
//
// Every grant a local bucket debits during an outage is tallied per account
// (a local reservation refunded before it is reported is taken back). The
// probe that finds the control plane back first reports the tally
// (AdmissionService.ReportGrants: the account's bucket is debited as if
// those sockets had been admitted centrally now, stopping where central
// admission would refuse), then asks for its own admission; a sign of life
// does the same without a request. So the sockets a fleet opened during an
// outage count against the account after it, and the fleet stays within
// rate + burst instead of adding a restarted control plane's full bucket on
// top. A report that is not confirmed is kept and sent again with the same
// report id (the control plane applies an id once); one the control plane
// refuses (Unimplemented from one that predates the hand-over) is dropped
// with a one-time notice.
//
// # The agent stream
//
// Run holds one AgentService.Connect stream until its context ends:
//
//   - on connect it sends a hello (AgentID, Host, Version,
//     CapabilityVersion and the account keys: Config.Accounts, or the
//     broker's);
//   - every Config.Heartbeat (default 5s) it sends a heartbeat carrying the
//     current account keys (the control plane counts an agent live for 15 s
//     after its last one);
//   - Report403 queues an upstream-403 report without blocking; reports for
//     one account queued together (or while disconnected) are coalesced into
//     one report with a count and the longest retry-after; ReportRateLimits
//     queues an account's latest plan usage (a newer report replaces an
//     unsent one);
//   - every policy push sets the account's local policy, turn budget, live
//     count and pause (the learned upgrade throttle);
//   - when the stream fails or the control plane closes it (with a reason,
//     logged; CloseReason), Run reconnects: at once when the stream had been
//     up for 2s or more (another replica, or the same one restarted, answers
//     before the agent's liveness lapses), else after a jittered exponential
//     backoff (250ms doubling to 2s, ±20%);
//   - when its context ends, Run sends a goodbye, waits up to one second for
//     the control plane to end the stream, and returns.
//
// # The broker's tokens
//
// With Config.Broker the control plane's credential broker holds each
// account's sign-in and hands this data plane short-lived access tokens
// over CredentialService, never a refresh token. The accounts served are
// Config.Accounts, or the agent token's scope (every account the broker
// holds) as ServedAccounts answers. A token is fetched again when its
// expiry is within the data plane's skew rule (codexauth.Fresh), the moment
// the broker refreshes it, so the broker's lease makes one refresh per
// expiry for the whole fleet; Run fetches tokens ahead of expiry. Errors
// are the credentials package's: *accounts.UnavailableError while the
// broker cannot be reached or has no usable token yet (the turn is answered
// 503 with retry-after; Run keeps trying and logs once that it waits),
// *accounts.LoginRequiredError when an operator must log an account in
// (clodexctl account login).
//
// # Tracing
//
// Every RPC is a client span (otelgrpc), so the Admit RPC is a child span
// of the caller's span (the upstream attempt) and continues inside the
// control plane. Admit also sets clodex.admission.mode, .decision,
// .wait_ms and .retry_after_ms on the caller's span when it is recording.
//
// Nothing here logs or returns a token or a raw account id; account keys
// are opaque hashes (internal/account). The package never imports the
// control plane's packages, only its generated API
// (proto/gen/go/clodex/controlplane/v1).
package control
