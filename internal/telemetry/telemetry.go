package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Standard OTLP environment variables Setup reads.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
)

// Config configures Setup.
type Config struct {
	// ServiceName is service.name. (Required)
	ServiceName string
	// Version is service.version. (Optional)
	Version string
	// InstanceID is service.instance.id. (Optional)
	InstanceID string
	// LookupEnv reads the OTEL_EXPORTER_OTLP_* variables (os.LookupEnv in
	// main). (Optional; nil means none is set: no exporter)
	LookupEnv func(string) (string, bool)
}

// Exporting reports whether lookup configures an OTLP trace endpoint.
func Exporting(lookup func(string) (string, bool)) bool {
	return env(lookup, EnvTracesEndpoint) != "" || env(lookup, EnvEndpoint) != ""
}

func env(lookup func(string) (string, bool), key string) string {
	if lookup == nil {
		return ""
	}
	v, _ := lookup(key)
	return strings.TrimSpace(v)
}

// Setup installs the propagator and, when an OTLP endpoint is configured,
// a tracer provider exporting to it. shutdown flushes and stops the
// exporter; call it once, bounded by ctx, during shutdown.
func Setup(ctx context.Context, cfg Config) (shutdown func(context.Context) error, err error) {
	if cfg.ServiceName == "" {
		return nil, errors.New("telemetry setup: ServiceName is required")
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	noop := func(context.Context) error { return nil }
	if !Exporting(cfg.LookupEnv) {
		return noop, nil
	}

	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.ServiceName)}
	if cfg.Version != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.Version))
	}
	if cfg.InstanceID != "" {
		attrs = append(attrs, attribute.String("service.instance.id", cfg.InstanceID))
	}
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithFromEnv(), resource.WithAttributes(attrs...))
	if err != nil {
		return nil, fmt.Errorf("telemetry setup: resource: %w", err)
	}

	protocol := env(cfg.LookupEnv, EnvTracesProtocol)
	if protocol == "" {
		protocol = env(cfg.LookupEnv, EnvProtocol)
	}
	var exp *otlptrace.Exporter
	switch protocol {
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	default:
		return nil, fmt.Errorf("telemetry setup: %s %q is not supported; allowed grpc, http/protobuf", EnvProtocol, protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry setup: otlp exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}
