// Package node assembles and runs one data plane: the production path of
// clodex-dataplane, and the one every in-process test of the data plane
// builds (the gateway's end-to-end tests, e2e/, e2e/trace, the benchmarks).
//
//	n, err := node.Start(ctx, node.Config{CodexAuth: path, UpstreamURL: url}, os.Stdout, os.Stderr)
//	err = n.Serve(ctx) // until ctx ends or Close; then the shutdown order of Close
//
// Start wires, in order: the logger and the one-time notices (stderr),
// telemetry, the control plane, the agent, the admission client, the
// connection pool, the gateway and the listeners. The control plane is
// remote (Config.ControlPlane, dialed with the agent token and the TLS
// settings) or embedded: the real control-plane server (package
// controlplane, with a store holding Config.Policy as the default policy)
// on an in-process bufconn listener, reached through the same gRPC client
// options as a remote one. The pool opens its sockets with the
// credential source's account credentials, reports every upgrade refused
// with 403 to the control plane through the agent, offers every frame to
// the rate-limits sink, and asks the admission client before it opens a
// new socket. The gateway
// takes each turn's budget from the control plane's latest push for the
// account, else from Config.Policy.
//
// Node.Close holds the shutdown order, written once. This package lives
// outside dataplane/ because it imports the control plane's packages for
// embedded mode; no package under dataplane/ does.
//
// Config's fields are clodex-dataplane's flags (errors name them); the
// command parses flags and the environment into a Config and calls Start.
// Tests inject only what the command leaves at its default: the retry
// clock and jitter source (Config.RetryClock, Config.RetryRand) and the
// tracer provider.
package node
