package node_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node"
	"github.com/clodex/clodex/internal/node/nodetest"
)

// Every goroutine a Node starts has stopped once Close returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startSim(t *testing.T) (*nodetest.Sim, node.Config) {
	t.Helper()
	sim := nodetest.StartSim(t, codexsim.Config{AcceptTokens: map[string]string{"tok-node": "acct-node"}})
	return sim, sim.Config(nodetest.WriteAuth(t, "tok-node", "acct-node", ""))
}

// A bad configuration is one *ConfigError naming every flag at fault.
func TestStartBadConfig(t *testing.T) {
	_, err := node.Start(t.Context(), node.Config{Listen: "nocolon", LogLevel: "loud"}, io.Discard, io.Discard)
	var ce *node.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Start = %v, want a *node.ConfigError", err)
	}
	for _, want := range []string{"--codex-auth", `--listen "nocolon"`, `--log-level "loud"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start error %q, want it to name %s", err, want)
		}
	}
}

// Close while serving stops the listeners and makes Serve return nil;
// Close again is a no-op.
func TestCloseWhileServing(t *testing.T) {
	_, cfg := startSim(t)
	var stdout strings.Builder
	n, err := node.Start(t.Context(), cfg, &stdout, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := "export ANTHROPIC_BASE_URL=http://" + n.Addr() + "  #"; !strings.HasPrefix(stdout.String(), want) {
		t.Errorf("stdout %q, want the export line for %s", stdout.String(), n.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- n.Serve(context.Background()) }()
	// Serving: the listener answers (it accepts from Start on; Serve
	// answers).
	tr := &http.Transport{}
	resp, err := (&http.Client{Transport: tr}).Get("http://" + n.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tr.CloseIdleConnections()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz = %d, want 200", resp.StatusCode)
	}
	n.Close(context.Background())
	if err := <-served; err != nil {
		t.Errorf("Serve after Close = %v, want nil", err)
	}
	n.Close(context.Background())
	if c, err := net.Dial("tcp", n.Addr()); err == nil {
		c.Close()
		t.Errorf("the API listener %s still accepts after Close", n.Addr())
	}
}

// A Node closed before it served releases its listener, and Serve then
// refuses to start.
func TestCloseBeforeServe(t *testing.T) {
	_, cfg := startSim(t)
	cfg.AdminListen = "127.0.0.1:0"
	n, err := node.Start(t.Context(), cfg, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if n.AdminAddr() == "" {
		t.Fatal("AdminAddr is empty with an admin listener")
	}
	n.Close(context.Background())
	if err := n.Serve(context.Background()); !errors.Is(err, node.ErrClosed) {
		t.Errorf("Serve after Close = %v, want ErrClosed", err)
	}
	for _, addr := range []string{n.Addr(), n.AdminAddr()} {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Errorf("listener %s still accepts after Close", addr)
		}
	}
}

// The data plane's admin listener: on 0.0.0.0 it refuses to start without
// --metrics-token-file, naming the flag; with one, /metrics requires the
// token; on loopback it refuses a rebinding Host and a browser's Origin;
// /debug/pprof is served only with --pprof.
func TestAdminListener(t *testing.T) {
	_, cfg := startSim(t)
	open := cfg
	open.AdminListen = "0.0.0.0:0"
	_, err := node.Start(t.Context(), open, io.Discard, io.Discard)
	var ce *node.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "--admin-listen 0.0.0.0:0 is not a loopback address: --metrics-token-file is required") {
		t.Fatalf("Start with --admin-listen 0.0.0.0:0 and no token = %v; want a *ConfigError naming --metrics-token-file", err)
	}

	const token = "metrics-secret-1"
	open.MetricsTokenFile = filepath.Join(t.TempDir(), "metrics.token")
	if err := os.WriteFile(open.MetricsTokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(t.Context(), open, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(context.Background()) })
	go func() { _ = n.Serve(context.Background()) }()
	_, port, _ := net.SplitHostPort(n.AdminAddr())
	openURL := "http://127.0.0.1:" + port

	loop := cfg
	loop.AdminListen = "127.0.0.1:0"
	ln, err := node.Start(t.Context(), loop, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(context.Background()) })
	go func() { _ = ln.Serve(context.Background()) }()
	loopURL := "http://" + ln.AdminAddr()

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	get := func(url string, hdr map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		name, url string
		hdr       map[string]string
		wantCode  int
		wantBody  string
	}{
		{"0.0.0.0 without the token", openURL + "/metrics", nil, 401, "--metrics-token-file"},
		{"0.0.0.0 with a wrong token", openURL + "/metrics", map[string]string{"Authorization": "Bearer metrics-secret-2"}, 401, "wrong bearer token"},
		{"0.0.0.0 with the token", openURL + "/metrics", map[string]string{"Authorization": "Bearer " + token}, 200, "go_goroutines"},
		{"0.0.0.0 pprof off", openURL + "/debug/pprof/", map[string]string{"Authorization": "Bearer " + token}, 404, "--pprof"},
		{"loopback", loopURL + "/metrics", nil, 200, "go_goroutines"},
		{"loopback, DNS rebinding Host", loopURL + "/metrics", map[string]string{"Host": "rebind.attacker.example:17646"}, 403, "is not a loopback host"},
		{"loopback, foreign Origin", loopURL + "/metrics", map[string]string{"Origin": "https://evil.example"}, 403, `Origin "https://evil.example" is not allowed`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := get(tt.url, tt.hdr)
			if code != tt.wantCode || !strings.Contains(body, tt.wantBody) {
				t.Errorf("GET %s = %d %.200q; want %d containing %q", tt.url, code, body, tt.wantCode, tt.wantBody)
			}
		})
	}
}
