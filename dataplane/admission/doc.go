// Package admission is the data plane's client of the control plane's
// AdmissionService, with a local fallback bucket for when the control plane
// cannot be reached.
//
// Only a brand-new upstream socket asks. Reusing a head never does, and a
// replacement socket for a request that was already admitted (transport
// retry, previous_response_not_found, websocket_connection_limit_reached) is
// not paced: callers simply do not call Admit for those.
//
//	c, err := admission.New(admission.Config{Conn: conn, AgentID: id, Fallback: envPolicy, Logger: logger})
//	...
//	err := c.Admit(ctx, account.Key(chatgptAccountID))
//	var refused *admission.RefusedError
//	switch {
//	case err == nil: // dial now (any granted delay was already waited out)
//	case errors.As(err, &refused): // retryable: the next attempt waits exactly refused.RetryAfter
//	default: // ctx ended (or a programming error: ErrInvalidKey, ErrClosed)
//	}
//
// # Central admission
//
// Admit sends one Admit RPC for the account key with a deadline of
// Config.Timeout (250 ms by default) and acts on the answer: ADMIT returns
// nil; WAIT waits out wait_ms inside Admit and returns nil; REFUSE returns a
// *RefusedError whose RetryAfter is the control plane's hint, already capped
// to fit the request budget. A request whose context ends during a wait
// cancels its reservation (a Cancel RPC under a short context detached from
// the request's cancellation) so the token goes back to the bucket, and
// Admit returns ctx.Err().
//
// # Several control planes
//
// One connection serves every replica: ParseControlPlanes reads a
// --control-plane value (host:port, whose name may resolve to several
// replicas; a comma-separated list; or dns:///host:port) and
// ControlPlanes.DialOptions makes the connection balance round robin over
// the replicas that report their store SERVING (StoreHealthService), so a
// replica that is down, draining or cut off from the shared store gets no
// RPCs. An admission RPC that fails with Unavailable (its replica died
// under it) is tried again on another replica within the same deadline,
// so a replica's death costs no request a local decision.
//
// # Local fallback
//
// A control plane that does not answer (Unavailable, DeadlineExceeded, any
// transport error) never fails a turn: the request is decided at once by a
// local per-account bucket holding this host's share of the account's
// policy, rate max(1, floor(rate / live)) and burst max(1, ceil(burst /
// live)) with live = Config.LiveAgents(account key) (a rate of 0, pacing
// off, stays 0). The data plane passes agent.Agent.LiveAgents, the highest
// count pushed in the last 15 s, so a restarted control plane pushing 1, 2,
// 3 as agents register again does not hand one host the whole account. The
// policy is the last one seen through SetPolicy, or Config.Fallback (the
// environment defaults) for an account never seen. The switch is announced
// once through Config.Notify, and Mode reports "local".
//
// Each outage starts with new local buckets holding zero tokens, refilling
// at the share's rate up to the share's burst. The switch follows requests
// the control plane has just admitted from the account's central bucket,
// which this host cannot see; a full local burst on top of them would let
// the fleet open up to a whole extra burst of sockets at once (the
// upstream answers that with 403s). Starting empty costs at most one
// burst per outage and never exceeds the policy.
//
// "Admits locally at once" means: it asks the local bucket at once,
// without waiting for the control plane, and applies the bucket's decision by the same rule as the
// control plane (admit; wait within the derived bound; refuse with the hint
// only when the policy can refuse). The share is this host's part of the
// account's fleet-wide rate, so admitting everything unpaced would let N
// hosts open N times the configured rate. Refusals from the local bucket
// have RefusedError.Local set.
//
// While local, the client goes back to the control plane with jittered
// exponential backoff (250 ms doubling to 2 s, ±20 %): the first Admit
// after the backoff expires asks the control plane again (one such probe at
// a time; concurrent requests keep deciding locally). A probe that answers
// switches back to central admission, uses that answer, and is announced
// once; a probe that fails extends the backoff. There is no background
// goroutine: a probe costs at most Config.Timeout of one request's latency
// per backoff interval, and only while the control plane hangs (a refused
// connection fails at once). The gRPC connection's own reconnect backoff
// should match; see DialOption. CentralMaybeBack cuts the backoff short:
// the data plane calls it when its agent stream reconnects, so the next
// Admit asks the control plane at once.
//
// # Hand-over
//
// Every grant a local bucket debits during an outage is tallied per
// account (a local reservation refunded before it is reported is taken
// back). The probe that finds the control plane back first reports the
// tally (AdmissionService.ReportGrants: the account's bucket is debited as
// if those sockets had been admitted centrally now, stopping where central
// admission would refuse), then asks for its own admission; Recover does
// the same without a request, and the data plane calls it when its agent
// stream connects. So the sockets a fleet opened during an outage count
// against the account after it, and the fleet stays within rate + burst
// instead of adding a restarted control plane's full bucket on top. A
// report that is not confirmed is kept and sent again with the same
// report id (the control plane applies an id once); one the control plane
// refuses (Unimplemented from one that predates the hand-over) is dropped
// with a one-time notice.
//
// A control plane that answers with an error of another kind
// (Unauthenticated, PermissionDenied, Internal, ...) is reachable but
// unusable: that request is decided locally too, the error is logged
// (rate-limited) and announced once per code, and the mode stays central so
// the next request asks again.
//
// # Tracing
//
// Admit passes ctx to the RPC, so with the otelgrpc client stats handler on
// Config.Conn the Admit RPC is a child span of the caller's span (the
// upstream attempt) and continues inside the control plane. Admit also sets
// clodex.admission.mode, .decision, .wait_ms and .retry_after_ms on the
// caller's span when it is recording.
//
// Nothing here logs or returns an account id or a token; account keys are
// opaque hashes (internal/account).
package admission
