package telemetry

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
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

// adminServer serves AdminHandler(o) on a real listener at listen and
// returns its base URL (always dialled through 127.0.0.1).
func adminServer(t *testing.T, listen string, o AdminOptions) string {
	t.Helper()
	reg := NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "clodex_test_things_total", Help: "x"})
	reg.MustRegister(c)
	c.Add(3)
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	o.Listen = ln.Addr().String()
	h, err := AdminHandler(reg, o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return "http://127.0.0.1:" + port
}

func adminGet(t *testing.T, url string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestAdminHandler(t *testing.T) {
	base := adminServer(t, "127.0.0.1:0", AdminOptions{Facts: map[string]string{"version": "v1.2.3"}})
	if code, body := adminGet(t, base+"/metrics", nil); code != 200 || !strings.Contains(body, "clodex_test_things_total 3") || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics = %d, body lacks the counter or go collector:\n%.500s", code, body)
	}
	if code, body := adminGet(t, base+"/debug/", nil); code != 200 || body != "version: v1.2.3\n" {
		t.Errorf("/debug/ = %d %q", code, body)
	}
	if code, body := adminGet(t, base+"/debug/pprof/", nil); code != 404 || !strings.Contains(body, "--pprof") {
		t.Errorf("/debug/pprof/ without Pprof = %d %q; want 404 naming --pprof", code, body)
	}
	pp := adminServer(t, "127.0.0.1:0", AdminOptions{Pprof: true})
	if code, _ := adminGet(t, pp+"/debug/pprof/", nil); code != 200 {
		t.Errorf("/debug/pprof/ with Pprof = %d", code)
	}
}

// TestAdminListenerChecksCallers: the admin listener refuses what the API
// listener refuses (a rebinding Host on loopback, any Origin), and off
// loopback it requires its bearer token.
func TestAdminListenerChecksCallers(t *testing.T) {
	loop := adminServer(t, "127.0.0.1:0", AdminOptions{})
	const token = "s3cret-admin-token"
	open := adminServer(t, "0.0.0.0:0", AdminOptions{Token: token})
	tests := []struct {
		name     string
		base     string
		hdr      map[string]string
		wantCode int
		wantMsg  string
	}{
		{"loopback, loopback host", loop, nil, 200, "clodex_test_things_total 3"},
		{"loopback, localhost", loop, map[string]string{"Host": "localhost:9"}, 200, "clodex_test_things_total"},
		{"DNS rebinding host", loop, map[string]string{"Host": "attacker.example:17646"}, 403, `Host "attacker.example:17646" is not a loopback host`},
		{"foreign origin", loop, map[string]string{"Origin": "https://evil.example"}, 403, `Origin "https://evil.example" is not allowed`},
		{"localhost origin", loop, map[string]string{"Origin": "http://localhost:3000"}, 403, "is not allowed"},
		{"off loopback, no token", open, nil, 401, "--metrics-token-file"},
		{"off loopback, wrong token", open, map[string]string{"Authorization": "Bearer nope"}, 401, "missing or wrong bearer token"},
		{"off loopback, the token", open, map[string]string{"Authorization": "Bearer " + token, "Host": "clodex-cp:17701"}, 200, "clodex_test_things_total 3"},
		{"off loopback, the token but an origin", open, map[string]string{"Authorization": "Bearer " + token, "Origin": "https://evil.example"}, 403, "is not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := adminGet(t, tt.base+"/metrics", tt.hdr)
			if code != tt.wantCode || !strings.Contains(body, tt.wantMsg) {
				t.Errorf("GET /metrics = %d %.300q; want %d containing %q", code, body, tt.wantCode, tt.wantMsg)
			}
			if strings.Contains(body, token) && code != 200 {
				t.Errorf("the answer leaks the token: %q", body)
			}
		})
	}
	if _, err := AdminHandler(NewRegistry(), AdminOptions{Listen: "0.0.0.0:17646"}); err == nil {
		t.Error("AdminHandler served a non-loopback listener without a token")
	}
}

func TestCheckAdminFlags(t *testing.T) {
	tests := []struct {
		listen, tokenFile string
		pprof             bool
		want              string // "" for no error
	}{
		{"", "", false, ""},
		{"127.0.0.1:17646", "", true, ""},
		{"[::1]:17646", "", false, ""},
		{"0.0.0.0:17646", "/etc/clodex/metrics.token", true, ""},
		{"0.0.0.0:17646", "", false, "--admin-listen 0.0.0.0:17646 is not a loopback address: --metrics-token-file is required"},
		{":17646", "", false, "--metrics-token-file is required"},
		{"", "/t", false, "--metrics-token-file is set but --admin-listen is not"},
		{"", "", true, "--pprof is set but --admin-listen is not"},
	}
	for _, tt := range tests {
		err := CheckAdminFlags(tt.listen, tt.tokenFile, tt.pprof)
		if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("CheckAdminFlags(%q, %q, %v) = %v; want %q", tt.listen, tt.tokenFile, tt.pprof, err, tt.want)
		}
	}
}

// otlpReceiver is an OTLP/HTTP traces endpoint that keeps every request.
type otlpReceiver struct {
	mu   sync.Mutex
	reqs []*collectortrace.ExportTraceServiceRequest
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var m collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.reqs = append(r.reqs, &m)
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// resources returns the resource attributes of every exported batch.
func (r *otlpReceiver) resources() []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]string
	for _, req := range r.reqs {
		for _, rs := range req.GetResourceSpans() {
			m := map[string]string{}
			for _, kv := range rs.GetResource().GetAttributes() {
				m[kv.GetKey()] = kv.GetValue().GetStringValue()
			}
			out = append(out, m)
		}
	}
	return out
}

// exportedResource runs Setup as main does, with the process environment
// (the OTLP exporter reads its endpoint from there) pointed at a receiver,
// ends one span and returns the resource the receiver saw.
func exportedResource(t *testing.T, cfg Config, env map[string]string) map[string]string {
	t.Helper()
	rcv := &otlpReceiver{}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	full := map[string]string{EnvEndpoint: srv.URL, EnvProtocol: "http/protobuf"}
	for k, v := range env {
		full[k] = v
	}
	for k, v := range full {
		t.Setenv(k, v)
	}
	cfg.LookupEnv = os.LookupEnv
	shutdown, err := Setup(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("test").Start(t.Context(), "one")
	span.End()
	if err := shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown (flush to the receiver) = %v", err)
	}
	res := rcv.resources()
	if len(res) != 1 {
		t.Fatalf("receiver got %d resource batches, want 1", len(res))
	}
	return res[0]
}

func TestResourceFromEnvironment(t *testing.T) {
	base := Config{ServiceName: "clodex-dataplane", Version: "v1.2.3", InstanceID: "host-1-abc"}
	tests := []struct {
		name string
		env  map[string]string
		want map[string]string
	}{
		{"defaults", nil, map[string]string{
			"service.name": "clodex-dataplane", "service.version": "v1.2.3", "service.instance.id": "host-1-abc",
		}},
		{"OTEL_SERVICE_NAME", map[string]string{EnvServiceName: "clodex-dataplane-b"}, map[string]string{
			"service.name": "clodex-dataplane-b", "service.version": "v1.2.3",
		}},
		{"attributes", map[string]string{EnvResourceAttributes: "host.name=node-2, deployment.environment=demo,team=a%2Cb%3Dc"}, map[string]string{
			"service.name": "clodex-dataplane", "host.name": "node-2", "deployment.environment": "demo", "team": "a,b=c",
		}},
		{"service.name attribute", map[string]string{EnvResourceAttributes: "service.name=from-attrs"}, map[string]string{
			"service.name": "from-attrs",
		}},
		{"OTEL_SERVICE_NAME wins over the attribute", map[string]string{
			EnvResourceAttributes: "service.name=from-attrs,service.namespace=clodex", EnvServiceName: "from-name",
		}, map[string]string{"service.name": "from-name", "service.namespace": "clodex"}},
		{"attribute overrides the instance id", map[string]string{EnvResourceAttributes: "service.instance.id=pod-7"}, map[string]string{
			"service.instance.id": "pod-7",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := exportedResource(t, base, tt.env)
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("resource %s = %q, want %q (resource %v)", k, got[k], v, got)
				}
			}
			if got["telemetry.sdk.language"] != "go" {
				t.Errorf("resource lacks the SDK attributes: %v", got)
			}
		})
	}
}

func TestServiceName(t *testing.T) {
	cfg := Config{ServiceName: "clodex-controlplane"}
	if got := ServiceName(cfg); got != "clodex-controlplane" {
		t.Errorf("ServiceName(no env) = %q", got)
	}
	cfg.LookupEnv = lookup(map[string]string{EnvServiceName: " cp-a "})
	if got := ServiceName(cfg); got != "cp-a" {
		t.Errorf("ServiceName(OTEL_SERVICE_NAME) = %q, want cp-a", got)
	}
	cfg.LookupEnv = lookup(map[string]string{EnvResourceAttributes: "service.name=cp-b"})
	if got := ServiceName(cfg); got != "cp-b" {
		t.Errorf("ServiceName(OTEL_RESOURCE_ATTRIBUTES) = %q, want cp-b", got)
	}
}

func TestSetupRejectsMalformedResourceAttributes(t *testing.T) {
	for _, bad := range []string{"novalue", "=value", "a=b,c", "k=%zz"} {
		// No endpoint: the mistake is reported even when nothing exports.
		_, err := Setup(t.Context(), Config{ServiceName: "x", LookupEnv: lookup(map[string]string{EnvResourceAttributes: bad})})
		if err == nil {
			t.Errorf("Setup(%s=%q) succeeded", EnvResourceAttributes, bad)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, EnvResourceAttributes) || !(strings.Contains(msg, "key1=value1") || strings.Contains(msg, "percent-encoding")) {
			t.Errorf("Setup(%s=%q) error = %q, want the variable and the allowed form", EnvResourceAttributes, bad, msg)
		}
	}
}
