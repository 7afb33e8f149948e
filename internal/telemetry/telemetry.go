package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
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
	// EnvServiceName overrides Config.ServiceName (and a service.name in
	// EnvResourceAttributes), so that two processes of one binary can be
	// told apart in a trace.
	EnvServiceName = "OTEL_SERVICE_NAME"
	// EnvResourceAttributes adds resource attributes:
	// "key1=value1,key2=value2", values percent-encoded where they hold
	// ',', '=' or '%'.
	EnvResourceAttributes = "OTEL_RESOURCE_ATTRIBUTES"
)

// Config configures Setup.
type Config struct {
	// ServiceName is service.name unless OTEL_SERVICE_NAME or a
	// service.name in OTEL_RESOURCE_ATTRIBUTES says otherwise (in that
	// order). (Required)
	ServiceName string
	// Version is service.version. (Optional)
	Version string
	// InstanceID is service.instance.id. (Optional)
	InstanceID string
	// LookupEnv reads OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and the
	// OTEL_EXPORTER_OTLP_* variables (os.LookupEnv in main). (Optional;
	// nil means none is set: no exporter)
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
// exporter; call it once, bounded by ctx, during shutdown. A malformed
// OTEL_RESOURCE_ATTRIBUTES is an error whether or not traces are exported,
// so a typo shows at start rather than when tracing is turned on.
func Setup(ctx context.Context, cfg Config) (shutdown func(context.Context) error, err error) {
	if cfg.ServiceName == "" {
		return nil, errors.New("telemetry setup: ServiceName is required")
	}
	attrs, err := resourceAttributes(cfg)
	if err != nil {
		return nil, fmt.Errorf("telemetry setup: %w", err)
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	noop := func(context.Context) error { return nil }
	if !Exporting(cfg.LookupEnv) {
		return noop, nil
	}

	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithAttributes(attrs...))
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

// ServiceName is the service.name Setup gives the resource for cfg:
// OTEL_SERVICE_NAME, else a service.name in OTEL_RESOURCE_ATTRIBUTES, else
// cfg.ServiceName. Binaries log it at start.
func ServiceName(cfg Config) string {
	if v := env(cfg.LookupEnv, EnvServiceName); v != "" {
		return v
	}
	attrs, err := parseResourceAttributes(env(cfg.LookupEnv, EnvResourceAttributes))
	if err == nil {
		for _, kv := range attrs {
			if kv.Key == "service.name" && kv.Value.AsString() != "" {
				return kv.Value.AsString()
			}
		}
	}
	return cfg.ServiceName
}

// resourceAttributes is the resource's attributes, later ones winning:
// service.version and service.instance.id from cfg, then
// OTEL_RESOURCE_ATTRIBUTES (which may set them too), then service.name.
func resourceAttributes(cfg Config) ([]attribute.KeyValue, error) {
	var attrs []attribute.KeyValue
	if cfg.Version != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.Version))
	}
	if cfg.InstanceID != "" {
		attrs = append(attrs, attribute.String("service.instance.id", cfg.InstanceID))
	}
	fromEnv, err := parseResourceAttributes(env(cfg.LookupEnv, EnvResourceAttributes))
	if err != nil {
		return nil, err
	}
	attrs = append(attrs, fromEnv...)
	return append(attrs, attribute.String("service.name", ServiceName(cfg))), nil
}

// parseResourceAttributes parses OTEL_RESOURCE_ATTRIBUTES: comma-separated
// key=value pairs, keys and values trimmed, values percent-decoded. Any
// malformed pair makes the whole value an error naming the pair.
func parseResourceAttributes(s string) ([]attribute.KeyValue, error) {
	if s == "" {
		return nil, nil
	}
	var attrs []attribute.KeyValue
	for _, pair := range strings.Split(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%s: %q is not key=value; want key1=value1,key2=value2", EnvResourceAttributes, strings.TrimSpace(pair))
		}
		val, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("%s: the value of %q is not valid percent-encoding; encode ',', '=' and '%%' as %%2C, %%3D and %%25", EnvResourceAttributes, k)
		}
		attrs = append(attrs, attribute.String(k, val))
	}
	return attrs, nil
}
