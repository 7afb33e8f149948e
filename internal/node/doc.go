// Package node assembles and runs one data plane: the production path of
// clodex-dataplane, and the one every in-process test of the data plane
// builds (the gateway's end-to-end tests, e2e/, the benchmarks).
//
//	n, err := node.Start(ctx, node.Config{CodexAuth: path, UpstreamURL: url}, os.Stdout, os.Stderr)
//	err = n.Serve(ctx) // until ctx ends or Close; then the shutdown order of Close
//	n.Addr()           // the API listener's address (AdminAddr: the admin listener's)
//
// node.go: [Start] builds the owned parts in order, each from the ones
// before it: the logger and notices, telemetry, the accounts' auth.json
// files (accounts.OpenFiles; none for a fleet member that takes its
// tokens from the control plane's credential broker), the control plane
// and its one client (control.Client, which runs until Close), the
// accounts router, the connection pool, the gateway and the listeners;
// [Node.Close] holds the shutdown order, written once. controlplane.go:
// the control plane, remote or embedded in this process
// (controlplane.Server on an in-process listener). listen.go: the API and
// admin listeners and the diagnostics file. config.go: [Config], whose
// fields are clodex-dataplane's flags (errors name them; [ConfigError]),
// and the parts' configurations derived from it.
//
// The package holds no logic of its own; only commands and test helpers
// import it (deps_test.go). Tests inject only what the command leaves at
// its default: the retry clock and jitter source (Config.RetryClock,
// Config.RetryRand) and the tracer provider. What the parts do is
// specified in docs/ (see docs/README.md); running it, in
// docs/operations.md.
package node
