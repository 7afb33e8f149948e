// Package storetest is the conformance suite of the control plane's
// stores: Run drives a store through the behaviour every implementation
// must share (docs/pacing.md's bucket decisions at the defaults, at low
// rates and at the boundaries; cancellations; policies and their
// versions; adaptive mode; hand-overs; the live-agent directory across
// two handles; plan quotas), at the same clock readings, and checks the
// results. store.Memory and redisstore.Store each run it from their
// tests through a Kind (Open, and Peer for a second handle on the same
// state).
//
// Clock is a settable clock and Describe renders an admission as the
// suite compares it, for the stores' own tests.
package storetest
