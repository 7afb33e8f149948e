package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func lookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestExporting(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{EnvEndpoint: "http://127.0.0.1:4318"}, true},
		{map[string]string{EnvTracesEndpoint: "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{EnvEndpoint: "  "}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=b"}, false},
	}
	for _, tt := range tests {
		if got := Exporting(lookup(tt.env)); got != tt.want {
			t.Errorf("Exporting(%v) = %v, want %v", tt.env, got, tt.want)
		}
	}
}

func TestSetup(t *testing.T) {
	if _, err := Setup(t.Context(), Config{}); err == nil {
		t.Error("Setup without ServiceName succeeded")
	}
	shutdown, err := Setup(t.Context(), Config{ServiceName: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdown(t.Context()); err != nil {
		t.Errorf("shutdown = %v", err)
	}
	if fields := otel.GetTextMapPropagator().Fields(); !strings.Contains(strings.Join(fields, ","), "traceparent") {
		t.Errorf("propagator fields = %v, want traceparent", fields)
	}
	_, err = Setup(t.Context(), Config{ServiceName: "test", LookupEnv: lookup(map[string]string{
		EnvEndpoint: "http://127.0.0.1:1", EnvProtocol: "carrier-pigeon",
	})})
	if err == nil || !strings.Contains(err.Error(), "allowed grpc, http/protobuf") {
		t.Errorf("Setup(bad protocol) error = %v, want the allowed values", err)
	}
}

func TestSetupWithEndpoint(t *testing.T) {
	// The endpoint is never reached: the exporter connects lazily, and a
	// shutdown bounded by an expired context returns instead of hanging.
	shutdown, err := Setup(t.Context(), Config{ServiceName: "test", Version: "v0", InstanceID: "i1",
		LookupEnv: lookup(map[string]string{EnvEndpoint: "http://127.0.0.1:9", EnvProtocol: "http/protobuf"})})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); !ok {
		t.Errorf("tracer provider = %T, want the SDK's", otel.GetTracerProvider())
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_ = shutdown(ctx)
}

func TestAdminHandler(t *testing.T) {
	reg := NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "clodex_test_things_total", Help: "x"})
	reg.MustRegister(c)
	c.Add(3)
	srv := httptest.NewServer(AdminHandler(reg, map[string]string{"version": "v1.2.3"}))
	t.Cleanup(srv.Close)
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "clodex_test_things_total 3") || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics = %d, body lacks the counter or go collector:\n%.500s", code, body)
	}
	if code, body := get("/debug/"); code != 200 || body != "version: v1.2.3\n" {
		t.Errorf("/debug/ = %d %q", code, body)
	}
	if code, _ := get("/debug/pprof/"); code != 200 {
		t.Errorf("/debug/pprof/ = %d", code)
	}
}
