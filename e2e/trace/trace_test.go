package trace

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node/nodetest"
)

const (
	// The credential the emulator accepts and the data plane presents.
	simToken   = "tok-trace-e2e-secret"
	simAccount = "acct-trace-e2e"
	// agentToken is the fleet's agent token.
	agentToken = "trace-agent-token-0123456789"
	// wantKey is account.Key(simAccount), computed outside the code under
	// test: "acct_" + the first 16 hex digits of
	// `printf acct-trace-e2e | sha256sum`.
	wantKey = "acct_8bdd854149d21b3a"

	// Words of the two prompts that must not reach any span.
	prompt1 = "marmalade quokka seventeen"
	prompt2 = "turquoise pangolin ninety"

	// Span names: the gateway's, and otelgrpc's for the Admit RPC.
	turnSpan    = "Gateway.Messages"
	attemptSpan = "Gateway.Attempt"
	admitSpan   = "clodex.controlplane.v1.AdmissionService/Admit"
)

// stack is the whole path of one test: a control plane on a loopback
// listener, and the data plane (package node, as clodex-dataplane runs it
// with --control-plane) in front of the emulator, with one exporter per
// side of the gRPC boundary.
type stack struct {
	baseURL string
	client  *http.Client
	sim     *nodetest.Sim
	// dp records the data plane's spans (gateway and Admit client);
	// cp the control plane's (Admit server).
	dp, cp *tracetest.InMemoryExporter
	// stop shuts everything down, in order, so that every span has ended
	// and been exported when it returns. It is safe to call twice.
	stop func()
}

// startStack builds the stack. The control plane's otelgrpc server
// handler takes its tracer provider from controlplane.Options but its
// propagator from the global one (controlplane.Options has no
// propagator), and so does the data plane's client handler; the test
// installs the W3C trace-context propagator globally and is not parallel.
func startStack(t *testing.T) *stack {
	t.Helper()
	prop := propagation.TraceContext{}
	prevProp := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(prop)
	t.Cleanup(func() { otel.SetTextMapPropagator(prevProp) })

	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane and emulator logs:\n%s", logs.String())
		}
	})

	cpExp, dpExp := tracetest.NewInMemoryExporter(), tracetest.NewInMemoryExporter()
	cpTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(cpExp))
	dpTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(dpExp))
	// The providers are shut down only at cleanup, after everything else:
	// shutting one down empties its in-memory exporter.
	t.Cleanup(func() {
		if err := dpTP.Shutdown(context.Background()); err != nil {
			t.Errorf("data plane TracerProvider.Shutdown: %v", err)
		}
		if err := cpTP.Shutdown(context.Background()); err != nil {
			t.Errorf("control plane TracerProvider.Shutdown: %v", err)
		}
	})

	// The control plane, served on a loopback listener.
	st, err := store.Open(store.Options{})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	adminTok, err := bearer.Parse("trace-admin-token-0123456789")
	if err != nil {
		t.Fatalf("bearer.Parse: %v", err)
	}
	agentTok, err := bearer.Parse(agentToken)
	if err != nil {
		t.Fatalf("bearer.Parse: %v", err)
	}
	cp, err := controlplane.New(controlplane.Options{
		Admissions:     st,
		Policies:       st,
		Agents:         st,
		Quotas:         st,
		AdminToken:     adminTok,
		AgentToken:     agentTok,
		Logger:         logger, // it adds component=controlplane itself
		TracerProvider: cpTP,
		ShutdownGrace:  2 * time.Second,
	})
	if err != nil {
		t.Fatalf("controlplane.New: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen for the control plane: %v", err)
	}
	cpCtx, cpCancel := context.WithCancel(context.Background())
	cpDone := make(chan error, 1)
	go func() { cpDone <- cp.Serve(cpCtx, lis) }()

	// The emulator, and the data plane joining the control plane's fleet.
	sim := nodetest.StartSim(t, codexsim.Config{AcceptTokens: map[string]string{simToken: simAccount}, Logger: logger})
	cfg := sim.Config(nodetest.WriteAuth(t, simToken, simAccount, ""))
	cfg.ControlPlane = lis.Addr().String()
	cfg.AgentToken = agentToken
	cfg.Version = "trace-e2e"
	cfg.LogLevel = "debug"
	cfg.TracerProvider = dpTP
	dp := nodetest.Start(t, cfg)

	tr := &http.Transport{}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			tr.CloseIdleConnections()
			// The data plane first: its Close waits for the handlers, so
			// every gateway span has ended, and says goodbye to the
			// control plane.
			dp.Stop(t)
			// The control plane last: Serve returns after its handlers,
			// so the server spans have ended too.
			cpCancel()
			if err := <-cpDone; err != nil {
				t.Errorf("control plane Serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &stack{
		baseURL: dp.URL,
		sim:     sim,
		client:  &http.Client{Transport: tr, Timeout: 30 * time.Second},
		dp:      dpExp,
		cp:      cpExp,
		stop:    stop,
	}
}

// messagesBody is a non-streaming Anthropic Messages request of one
// session; each prompt is a user turn, answered "ok" by the emulator.
func messagesBody(t *testing.T, sessionID string, prompts ...string) []byte {
	t.Helper()
	userID, err := json.Marshal(map[string]string{
		"device_id":    strings.Repeat("cd", 32),
		"account_uuid": "",
		"session_id":   sessionID,
	})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []any
	for i, p := range prompts {
		if i > 0 {
			msgs = append(msgs, map[string]any{"role": "assistant", "content": []any{map[string]string{"type": "text", "text": "ok"}}})
		}
		msgs = append(msgs, map[string]any{"role": "user", "content": []any{
			map[string]string{"type": "text", "text": p + "\n#sim reply ok"},
		}})
	}
	b, err := json.Marshal(map[string]any{
		"model":      "claude-sonnet-4-5",
		"max_tokens": 256,
		"metadata":   map[string]string{"user_id": string(userID)},
		"messages":   msgs,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// turn posts body and checks the answer is 200 with the text "ok".
func (s *stack) turn(t *testing.T, body []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.baseURL+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("x-api-key", "test-key")
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/messages: %v", err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST /v1/messages: read body: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/messages = %d %s, want 200", resp.StatusCode, got)
	}
	var msg struct {
		Content []struct {
			Type, Text string
		}
	}
	if err := json.Unmarshal(got, &msg); err != nil {
		t.Fatalf("POST /v1/messages: decode %s: %v", got, err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Type != "text" || msg.Content[0].Text != "ok" {
		t.Fatalf("POST /v1/messages content = %+v, want one text block \"ok\"", msg.Content)
	}
}

// TestTurnTraceCrossesIntoControlPlane: a turn that needs a new socket
// produces turn -> attempt -> Admit (client) in the data plane and Admit
// (server) in the control plane, one trace; the next turn of the same
// conversation reuses the head and produces an attempt but no Admit.
func TestTurnTraceCrossesIntoControlPlane(t *testing.T) {
	s := startStack(t)
	const session = "0f3c9a52-6a1e-4b7e-9d55-2f1e8b7c4a10"
	s.turn(t, messagesBody(t, session, prompt1))
	s.turn(t, messagesBody(t, session, prompt1, prompt2))
	s.stop() // every span has ended and been exported

	dp, cp := s.dp.GetSpans(), s.cp.GetSpans()
	t.Logf("data plane spans: %s", names(dp))
	t.Logf("control plane spans: %s", names(cp))

	var roots []tracetest.SpanStub
	for _, sp := range dp {
		if sp.Name == turnSpan {
			roots = append(roots, sp)
		}
	}
	if len(roots) != 2 {
		t.Fatalf("data plane has %d %s spans, want 2 (one per turn); spans: %s", len(roots), turnSpan, names(dp))
	}
	first, second := roots[0], roots[1]
	if first.StartTime.After(second.StartTime) {
		first, second = second, first
	}
	for i, r := range []tracetest.SpanStub{first, second} {
		if r.Parent.IsValid() {
			t.Errorf("turn %d: %s has parent %v, want it to be the root", i+1, turnSpan, r.Parent.SpanID())
		}
	}
	if first.SpanContext.TraceID() == second.SpanContext.TraceID() {
		t.Fatalf("both turns have trace id %v, want one trace per turn", first.SpanContext.TraceID())
	}

	t.Run("new socket", func(t *testing.T) {
		trace := first.SpanContext.TraceID()
		attempts := childrenOf(dp, first.SpanContext.SpanID(), attemptSpan)
		if len(attempts) != 1 {
			t.Fatalf("%s has %d %s children, want 1; spans: %s", turnSpan, len(attempts), attemptSpan, names(dp))
		}
		att := attempts[0]
		if got := attr(att, "clodex.socket.reused"); got.Type() != attribute.BOOL || got.AsBool() {
			t.Errorf("attempt clodex.socket.reused = %v, want false (a new socket)", got.String())
		}
		if got := attr(att, "clodex.account.key").AsString(); got != wantKey {
			t.Errorf("attempt clodex.account.key = %q, want %q", got, wantKey)
		}
		clients := childrenOf(dp, att.SpanContext.SpanID(), admitSpan)
		if len(clients) != 1 {
			t.Fatalf("%s has %d %s children, want 1; spans: %s", attemptSpan, len(clients), admitSpan, names(dp))
		}
		client := clients[0]
		if client.SpanKind != oteltrace.SpanKindClient {
			t.Errorf("data plane %s kind = %v, want client", admitSpan, client.SpanKind)
		}
		var servers []tracetest.SpanStub
		for _, sp := range cp {
			if sp.Name == admitSpan {
				servers = append(servers, sp)
			}
		}
		if len(servers) != 1 {
			t.Fatalf("control plane has %d %s spans, want 1; spans: %s", len(servers), admitSpan, names(cp))
		}
		server := servers[0]
		if server.SpanKind != oteltrace.SpanKindServer {
			t.Errorf("control plane %s kind = %v, want server", admitSpan, server.SpanKind)
		}
		for _, sp := range []tracetest.SpanStub{att, client, server} {
			if got := sp.SpanContext.TraceID(); got != trace {
				t.Errorf("%s (%v) trace id = %v, want the turn's %v", sp.Name, sp.SpanKind, got, trace)
			}
		}
		if got, want := server.Parent.SpanID(), client.SpanContext.SpanID(); got != want {
			t.Errorf("server %s parent = %v, want the client span %v", admitSpan, got, want)
		}
		if !server.Parent.IsRemote() {
			t.Error("server Admit span's parent is not remote; want it propagated in gRPC metadata")
		}
	})

	t.Run("reused head", func(t *testing.T) {
		trace := second.SpanContext.TraceID()
		attempts := childrenOf(dp, second.SpanContext.SpanID(), attemptSpan)
		if len(attempts) != 1 {
			t.Fatalf("%s has %d %s children, want 1; spans: %s", turnSpan, len(attempts), attemptSpan, names(dp))
		}
		if got := attr(attempts[0], "clodex.socket.reused"); got.Type() != attribute.BOOL || !got.AsBool() {
			t.Errorf("attempt clodex.socket.reused = %v, want true (the head of turn 1)", got.String())
		}
		if got := attr(attempts[0], "clodex.account.key").AsString(); got != wantKey {
			t.Errorf("attempt clodex.account.key = %q, want %q", got, wantKey)
		}
		for _, sp := range append(append([]tracetest.SpanStub(nil), dp...), cp...) {
			if sp.SpanContext.TraceID() == trace && sp.Name == admitSpan {
				t.Errorf("turn 2 has a %s span (%v); a reused head must not ask for admission", admitSpan, sp.SpanKind)
			}
		}
	})

	t.Run("no secrets", func(t *testing.T) {
		forbidden := []string{simAccount, simToken, prompt1, prompt2, "marmalade", "pangolin"}
		for _, sp := range append(append([]tracetest.SpanStub(nil), dp...), cp...) {
			for _, kv := range allAttrs(sp) {
				v := kv.Value.String()
				for _, f := range forbidden {
					if strings.Contains(v, f) {
						t.Errorf("span %s attribute %s = %q contains %q", sp.Name, kv.Key, v, f)
					}
				}
			}
		}
	})
}

// TestDroppedHeldSocketAsksForItsReplacement: a follow-up turn whose held
// socket drops before any output opens its replacement only after an
// Admit, in the replacement attempt's trace, as any new socket does; the
// attempt that continued the held socket asked nothing.
func TestDroppedHeldSocketAsksForItsReplacement(t *testing.T) {
	s := startStack(t)
	const session = "5b2d8e3f-1c4a-4f6e-8a7b-9c0d1e2f3a4b"
	s.turn(t, messagesBody(t, session, prompt1))
	// The held socket has sent turn 1's events; it drops after one more,
	// early in turn 2. Its replacement sends turn 2 (as many events as
	// turn 1) whole.
	events := int(s.sim.Stats().Events)
	drop := events + 1
	if err := s.sim.SetConfig(codexsim.ConfigPatch{CloseAfterEvents: &drop}); err != nil {
		t.Fatal(err)
	}
	s.turn(t, messagesBody(t, session, prompt1, prompt2))
	s.stop()

	dp := s.dp.GetSpans()
	var second tracetest.SpanStub
	for _, sp := range dp {
		if sp.Name == turnSpan && (second.Name == "" || sp.StartTime.After(second.StartTime)) {
			second = sp
		}
	}
	attempts := childrenOf(dp, second.SpanContext.SpanID(), attemptSpan)
	if len(attempts) != 2 {
		t.Fatalf("turn 2 has %d %s spans, want 2 (the held socket, then its replacement); spans: %s", len(attempts), attemptSpan, names(dp))
	}
	held, repl := attempts[0], attempts[1]
	if held.StartTime.After(repl.StartTime) {
		held, repl = repl, held
	}
	if got := attr(held, "clodex.socket.reused"); !got.AsBool() {
		t.Errorf("first attempt clodex.socket.reused = %v, want true (the held socket)", got.String())
	}
	if n := len(childrenOf(dp, held.SpanContext.SpanID(), admitSpan)); n != 0 {
		t.Errorf("the attempt on the held socket has %d Admit spans, want 0", n)
	}
	if got := attr(repl, "clodex.attempt.replacement"); !got.AsBool() {
		t.Errorf("second attempt clodex.attempt.replacement = %v, want true", got.String())
	}
	if got := attr(repl, "clodex.pool.decision").AsString(); got != "replacement" {
		t.Errorf("second attempt clodex.pool.decision = %q, want replacement", got)
	}
	if n := len(childrenOf(dp, repl.SpanContext.SpanID(), admitSpan)); n != 1 {
		t.Errorf("the replacement attempt has %d Admit spans, want 1: its new socket must ask like any other; spans: %s", n, names(dp))
	}
	if st := s.sim.Stats(); st.Upgrades != 2 {
		t.Errorf("emulator upgrades = %d, want 2 (turn 1's socket and the replacement)", st.Upgrades)
	}
}

// childrenOf returns the spans named name whose parent is parent.
func childrenOf(spans []tracetest.SpanStub, parent oteltrace.SpanID, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, sp := range spans {
		if sp.Name == name && sp.Parent.SpanID() == parent {
			out = append(out, sp)
		}
	}
	return out
}

// attr returns the value of the span's attribute key (the zero Value, of
// type INVALID, when it is absent).
func attr(sp tracetest.SpanStub, key attribute.Key) attribute.Value {
	for _, kv := range sp.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// allAttrs returns the span's attributes and those of its events (an
// exception event carries the error message) and links.
func allAttrs(sp tracetest.SpanStub) []attribute.KeyValue {
	out := append([]attribute.KeyValue(nil), sp.Attributes...)
	for _, ev := range sp.Events {
		out = append(out, attribute.String("event.name", ev.Name))
		out = append(out, ev.Attributes...)
	}
	for _, l := range sp.Links {
		out = append(out, l.Attributes...)
	}
	out = append(out, attribute.String("status.description", sp.Status.Description))
	return out
}

// names lists spans as name/kind for failure messages.
func names(spans []tracetest.SpanStub) string {
	var b strings.Builder
	for i, sp := range spans {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(sp.Name + "/" + sp.SpanKind.String())
	}
	return "[" + b.String() + "]"
}

// syncBuffer is a bytes.Buffer safe for the concurrent writers of a logger.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
