package gateway_test

import (
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/internal/node"
)

// The gateway's metrics are served on the data plane's admin listener, and
// each turn is one span with a child span per attempt, carrying account
// keys, never the raw account id or the prompt.
func TestMetricsAndSpans(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer func() {
		if err := tp.Shutdown(t.Context()); err != nil {
			t.Errorf("shut down the tracer provider: %v", err)
		}
	}()
	e := newEnv(t, envOptions{mutate: func(c *node.Config) {
		c.TracerProvider = tp
		c.AdminListen = "127.0.0.1:0"
		c.Pprof = true
	}})
	gateway.ReadAll(t, e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply metered"), nil))
	gateway.ReadAll(t, e.post(t, "/v1/messages", `{"model":`, nil))

	admin := "http://" + e.dp.AdminAddr()
	resp, err := e.client.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics := string(gateway.ReadAll(t, resp))
	for _, want := range []string{
		`clodex_dataplane_requests_total{status="200"} 1`,
		`clodex_dataplane_requests_total{status="400"} 1`,
		`clodex_dataplane_upstream_dials_total{result="ok"} 1`,
		`clodex_dataplane_turn_seconds_count{outcome="completed"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}
	resp, err = e.client.Get(admin + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	gateway.ReadAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/debug/pprof/ status %d with --pprof, want 200", resp.StatusCode)
	}

	var spans, attempts []sdktrace.ReadOnlySpan
	for _, sp := range sr.Ended() {
		switch sp.Name() {
		case "Gateway.Messages":
			spans = append(spans, sp)
		case "Gateway.Attempt":
			attempts = append(attempts, sp)
		}
	}
	if len(spans) != 1 {
		t.Fatalf("recorded %d turn spans, want 1 (one per turn; the bad request never reached a turn)", len(spans))
	}
	if len(attempts) != 1 || attempts[0].Parent().SpanID() != spans[0].SpanContext().SpanID() {
		t.Fatalf("recorded %d attempt spans, want 1, a child of the turn span", len(attempts))
	}
	aattrs := map[attribute.Key]attribute.Value{}
	for _, kv := range attempts[0].Attributes() {
		aattrs[kv.Key] = kv.Value
	}
	if aattrs["clodex.attempt"].AsInt64() != 0 || aattrs["clodex.socket.reused"].AsBool() ||
		aattrs["clodex.account.key"].AsString() == "" || aattrs["clodex.pool.decision"].AsString() == "" {
		t.Errorf("attempt span attrs %v, want attempt 0, a new socket, an account key and a pool decision", aattrs)
	}
	for _, sp := range sr.Ended() {
		for _, kv := range sp.Attributes() {
			if strings.Contains(kv.Value.String(), simAccount) || strings.Contains(kv.Value.String(), "metered") {
				t.Errorf("span %s attribute %s = %q carries the raw account id or prompt text", sp.Name(), kv.Key, kv.Value.String())
			}
		}
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range spans[0].Attributes() {
		attrs[kv.Key] = kv.Value
	}
	if spans[0].Name() != "Gateway.Messages" || attrs["clodex.outcome"].AsString() != "completed" || attrs["clodex.model.upstream"].AsString() != "gpt-5.5" {
		t.Errorf("span %s attrs %v, want Gateway.Messages, outcome completed, upstream model gpt-5.5", spans[0].Name(), attrs)
	}
}
