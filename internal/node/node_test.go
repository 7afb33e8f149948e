package node_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
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
