// Package agent is the data plane's side of the fleet: one long-lived
// AgentService.Connect stream to the control plane.
//
// New builds an Agent from Config; Run holds the stream until its context
// ends:
//
//   - on connect it sends a hello (ID, host, version, CapabilityVersion and
//     the account keys from Config.Accounts);
//   - every Config.Heartbeat (default 5s) it sends a heartbeat carrying the
//     current account keys (the control plane counts an agent live for
//     15 s after its last one);
//   - Report403 queues an upstream-403 report without blocking; reports
//     for one account queued together (or while disconnected) are
//     coalesced into one report with a count and the longest
//     retry-after; ReportRateLimits queues an account's latest plan usage
//     (a newer report replaces an unsent one);
//   - every policy push calls Config.OnPolicy synchronously with the
//     account key, the policy to pace at (RatePerMinute is the control
//     plane's effective rate) and the number of live agents serving the
//     account; LiveAgents returns the highest such number pushed within
//     the last 15 s (at least 1), so a restarted control plane's counts
//     climbing back 1, 2, 3 do not inflate a local share; Config.OnPause
//     gets the push's pause (the learned upgrade throttle);
//   - each time a stream is opened and its hello sent, Config.OnConnect
//     is called (the data plane makes admission ask the control plane
//     again at once);
//   - when the stream fails or the control plane closes it (with a
//     reason, logged), Run reconnects: at once when the stream had been up
//     for 2s or more (another replica, or the same one restarted, answers
//     before the agent's liveness lapses), else after a jittered
//     exponential backoff (250ms doubling to 2s, ±20%);
//   - when its context ends, Run sends a goodbye, waits up to one second
//     for the control plane to end the stream, and returns.
//
// NewID builds a process-unique agent id, "host-pid-random".
//
// The package never imports the control plane's packages, only its
// generated API (proto/gen/go/clodex/controlplane/v1).
package agent
