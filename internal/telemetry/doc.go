// Package telemetry sets up tracing and metrics for a clodex binary.
//
// Setup is called once from main: it builds the OTel resource
// (service.name, service.version, service.instance.id, and whatever
// OTEL_RESOURCE_ATTRIBUTES adds; OTEL_SERVICE_NAME overrides the binary's
// own service name, so that two data planes can be told apart in one
// trace), installs the W3C trace-context and baggage propagator, and
// installs an SDK tracer provider exporting over OTLP only when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (grpc or http/protobuf, chosen
// by OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL; the exporter reads the other
// standard OTEL_EXPORTER_OTLP_* variables itself). Without an endpoint no
// tracer provider is installed and spans cost next to nothing.
//
// NewRegistry returns a private Prometheus registry with the Go and process
// collectors; AdminHandler serves it on /metrics together with a /debug/
// facts page and, only with --pprof, /debug/pprof/, for an admin listener
// that is off unless a binary is given an address for it. The admin
// listener checks its callers as the data plane's API listener does
// (package hostcheck: a loopback Host on a loopback address, no Origin);
// off loopback it requires a bearer token (CheckAdminFlags is the rule
// both binaries apply to their flags).
package telemetry
