// Package storetest is the conformance suite of the control plane's
// stores, run from each store's tests:
//
//	storetest.Run(t, storetest.Kind{Open: open, Peer: peer}) // Peer: a second handle on the same state
//
// Run drives a store through the behaviour every implementation must
// share, at the same clock readings, and checks the results: the bucket
// decisions of docs/pacing.md at the defaults, at low rates and at the
// boundaries, and cancellations (bucket.go); policies and their versions,
// adaptive mode and hand-overs (policy.go); the live-agent directory
// across two handles and plan quotas (agents.go); the usage ledger: a
// batch applied once across handles, the minutes a query sums, the
// rows cap of a minute (usage.go). store.Memory and
// redisstore.Store each run it. Clock is a settable clock and Describe
// renders an admission as the suite compares it, for the stores' own
// tests.
package storetest
