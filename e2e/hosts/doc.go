// Package hosts runs clodex across real network links: the control plane,
// two data planes and clodex-sim each in its own Linux network namespace,
// joined by veth pairs, as four hosts would be.
//
//	link        control plane / emulator end    data plane end
//	cp - dp1    cp-dp1   10.201.1.1/30          dp1-cp   10.201.1.2/30
//	cp - dp2    cp-dp2   10.201.2.1/30          dp2-cp   10.201.2.2/30
//	sim - dp1   sim-dp1  10.202.1.1/30          dp1-sim  10.202.1.2/30
//	sim - dp2   sim-dp2  10.202.2.1/30          dp2-sim  10.202.2.2/30
//
// Each data plane has one link to the control plane and one to the
// emulator. The test runs a fan-out of new conversations through both data
// planes (no upstream 403, no failed turn), then takes the control plane's
// links down for 20 s while turns keep coming (no failed turn: each data
// plane admits from its share of the last policy), brings them back and
// waits for both agents to register again.
//
// It needs Linux, root and iproute2's ip. Elsewhere it skips and says why;
// under CI=true on Linux as root it fails instead of skipping when it
// cannot run.
package hosts
