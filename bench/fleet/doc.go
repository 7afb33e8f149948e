// Command fleet is the fleet benchmark behind `make bench-fleet`
// (scripts/bench-fleet.sh builds the binaries and runs it): real clodex
// processes on loopback, several data planes sharing one account against
// clodex-sim's upgrade throttle.
//
// Each configuration starts a fresh clodex-sim (--upgrade-limit 30
// --upgrade-window 10s by default), writes a Codex auth.json with the
// token the emulator accepts for every data plane, and starts 3
// clodex-dataplane processes; then 20 agents per data plane run new
// conversations back to back for 60 s, each a streaming Anthropic request
// with its own session id (so each turn needs a new upstream socket) and
// "#sim reply ok". An agent retries a 429 after its retry-after, on Claude
// Code's ladder, up to --max-retries times; a turn fails when its retries
// are exhausted or on any other error.
//
//   - central: one clodex-controlplane owns the account's bucket (policy
//     120/min, burst 5, set with clodexctl); every data plane joins it
//     with --control-plane.
//
//   - per-host: no control plane; each data plane paces itself at the full
//     rate with CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN=120, as each process
//     of the original TypeScript clodex paced itself.
//
//   - central-kill: central, with the control plane SIGKILLed 20 s into
//     the run and restarted on the same port 20 s later; the data planes
//     hand the grants they made locally over when it is back.
//
//   - replicas-kill: central over two clodex-controlplane replicas sharing
//     one redis-server; every data plane takes both addresses
//     (--control-plane a,b) and one replica is SIGKILLed 20 s in for
//     good. The note says how many data planes ever admitted locally.
//
//   - replicas-2x2: two replicas x two data planes (--accuracy-dataplanes)
//     on a hot account (--accuracy-rate 30/min, --accuracy-burst 5), with
//     no upstream throttle and clodex-sim's window as long as the run: the
//     most upgrades in any such window against rate x time + burst (+1%).
//
//   - central-adaptive-off: central with the learned throttle switched off
//     (clodexctl set-adaptive ACCOUNT off): against a limit above the
//     configured rate, throughput matches central's.
//
//   - learned-1, learned-3: the learned upgrade throttle with default
//     settings (no set-rate): --fanout new conversations (30) at once,
//     through 1 or 3 data planes, against clodex-sim at --fanout-limit
//     upgrades per --fanout-window (20 per 60 s) without a retry-after;
//     target at most 3 upstream 403s and no failed turn.
//     learned-off-1 and learned-off-3 are the same with adaptive off.
//
// The table reports, per configuration: the emulator's upstream 403s,
// failed turns, admitted new sockets per minute (upgrades over the run),
// the most upgrades in one throttle window, and p50/p99 turn latency
// (retries included). Everything runs under a hard --timeout, in process
// groups killed on exit, on 127.0.0.1 only.
package main
