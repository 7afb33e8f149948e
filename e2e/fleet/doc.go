// Package fleet is the multi-process integration test of the fleet: real
// clodex-dataplane processes against one clodex-controlplane and
// clodex-sim on loopback, built once per test run with `go build`
// (package bench/fleet/cluster starts and stops them). It checks that
// clodexctl set-rate reaches every data plane within a second, that
// killing the control plane mid-run fails no turn and restarting it
// restores central admission, and that adaptive mode lowers the effective
// rate after upstream 403s. It has no non-test code.
package fleet
