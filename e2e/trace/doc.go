// Package trace is the in-process end-to-end test of tracing across the
// process boundary: one Anthropic request through the data plane as
// clodex-dataplane runs it in a fleet (package internal/node: gateway,
// pool, admission client) and a control plane reached over gRPC on a
// loopback listener, each side with its own OpenTelemetry SDK tracer
// provider and in-memory exporter, to clodex-sim. It checks that a turn
// that opens a new socket yields turn -> attempt -> Admit (client) ->
// Admit (server) in one trace, that a turn reusing the head yields no
// Admit span, that a follow-up turn whose held socket drops asks for its
// replacement (an Admit under the replacement attempt), and that no span
// carries the raw account id or the prompt text. It has no non-test code.
package trace
