// Package telemetry sets up tracing and metrics for a clodex binary.
//
//	shutdown, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "clodex-dataplane", Version: version, LookupEnv: os.LookupEnv})
//	defer shutdown(ctx)                 // flushes the exporter
//	reg := telemetry.NewRegistry()      // private, with the Go and process collectors
//	h, err := telemetry.AdminHandler(reg, telemetry.AdminOptions{Listen: addr, Token: tok, Pprof: pprof, Facts: facts})
//	err = telemetry.CheckAdminFlags(listen, tokenFile, pprof) // the flags' rule, at start
//
// telemetry.go: [Setup], called once from main, builds the OTel resource
// (service.name, service.version, service.instance.id, what
// OTEL_RESOURCE_ATTRIBUTES adds; OTEL_SERVICE_NAME renames the process),
// installs the W3C trace-context and baggage propagator, and an SDK
// tracer provider exporting over OTLP only when OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (grpc or http/protobuf, by
// OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL); without one, spans cost next to
// nothing. admin.go: [AdminHandler] serves /metrics, the /debug/ facts
// page and, only with pprof, /debug/pprof/, checking its callers as the
// data plane's API listener does (package hostcheck) and, off loopback,
// a bearer token.
//
// The behaviour is specified in docs/operations.md §9 (tracing), §12
// (admin listeners) and §13 (metrics).
package telemetry
