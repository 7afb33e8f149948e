// Package node assembles and runs one data plane: the production path of
// clodex-dataplane, and the one every in-process test of the data plane
// builds (the gateway's end-to-end tests, e2e/, the benchmarks).
//
//	n, err := node.Start(ctx, node.Config{CodexAuth: path, UpstreamURL: url}, os.Stdout, os.Stderr)
//	err = n.Serve(ctx) // until ctx ends or Close; then the shutdown order of Close
//
// Start builds the owned parts in order, each from the ones before it:
// the logger and notices, telemetry, the accounts' auth.json files
// (accounts.OpenFiles; none for a fleet member that takes its tokens from
// the control plane's credential broker), the control plane — embedded in
// this process (controlplane.Server on an in-process listener) or remote —
// and its one client (control.Client, which runs until Close), the
// accounts router (accounts.Router), the connection pool, the gateway and
// the listeners (listen.go). Node.Close holds the shutdown order, written
// once. The package holds no logic of its own; only commands and test
// helpers import it (deps_test.go).
//
// Config's fields are clodex-dataplane's flags (errors name them); the
// command parses flags and the environment into a Config and calls Start.
// Tests inject only what the command leaves at its default: the retry
// clock and jitter source (Config.RetryClock, Config.RetryRand) and the
// tracer provider.
package node
