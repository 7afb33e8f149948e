//go:build deps

// Package deps records module dependencies in go.mod with imports that are
// never built (build tag deps). Every module listed is also imported by a
// package or a test, except google.golang.org/genproto/googleapis/rpc/errdetails,
// which nothing uses yet.
package deps

import (
	_ "github.com/anthropics/anthropic-sdk-go/v2"
	_ "github.com/coder/websocket"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	_ "go.opentelemetry.io/otel"
	_ "go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	_ "go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	_ "go.opentelemetry.io/otel/sdk"
	_ "go.opentelemetry.io/otel/sdk/trace/tracetest"
	_ "go.uber.org/goleak"
	_ "golang.org/x/sync/errgroup"
	_ "google.golang.org/genproto/googleapis/rpc/errdetails"
	_ "google.golang.org/grpc"
	_ "google.golang.org/grpc/health"
	_ "google.golang.org/grpc/reflection"
	_ "google.golang.org/grpc/test/bufconn"
	_ "google.golang.org/protobuf/proto"
	_ "pgregory.net/rapid"
)
