// Package fleet is the multi-process integration test of the fleet: real
// clodex-dataplane processes against one clodex-controlplane and
// clodex-sim on loopback, built once per test run with `go build`
// (package bench/fleet/cluster starts and stops them). It checks that
// clodexctl set-rate reaches every data plane within a second, that
// killing the control plane mid-run fails no turn and restarting it
// restores central admission, that adaptive mode lowers the effective
// rate after upstream 403s, and (TestLearnedThrottle) that with default
// settings 30 new conversations over three data planes against a limit
// of 20 upgrades per 60 s cost at most 3 upstream 403s and no failed turn;
// (TestRevocation) that a data plane whose scoped agent credential is
// removed through another replica answers its next turn 403 with
// x-should-retry: false and serves no more, and that on the same fleet a
// data plane started with --member-keys serves a member's key through a
// FLUSHALL until the member is removed through the other replica; and
// (TestDurability) that
// under load a FLUSHALL, a Redis killed and restarted with its AOF or
// restarted empty, garbage in every kind of record and every replica
// restarted against an empty Redis fail no turn and lose nothing durable,
// that a replica with another credential key is refused, and that no
// refresh token is redeemed twice. It has no non-test code.
package fleet
