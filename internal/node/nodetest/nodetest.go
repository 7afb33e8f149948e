// Package nodetest runs a data plane (package node, the assembly
// clodex-dataplane runs) in front of clodex-sim for tests, over real
// loopback sockets.
//
//	sim := nodetest.StartSim(t, codexsim.Config{AcceptTokens: map[string]string{"tok": "acct"}})
//	n := nodetest.Start(t, sim.Config(nodetest.WriteAuth(t, "tok", "acct")))
//	resp, err := http.Post(n.URL+"/v1/messages", …)
//
// Everything started is stopped at the test's cleanup: the data plane in
// its shutdown order (node.Node.Close), then the emulator.
package nodetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node"
)

// Sim is a clodex-sim served on a loopback httptest server.
type Sim struct {
	*codexsim.Server
	// URL is the emulator's HTTP base, http://127.0.0.1:PORT (/sim/stats,
	// /oauth/token).
	URL string
}

// StartSim starts the emulator with cfg; it is closed at t's cleanup,
// after everything started later (a data plane in front of it).
func StartSim(t testing.TB, cfg codexsim.Config) *Sim {
	t.Helper()
	s, err := codexsim.New(cfg)
	if err != nil {
		t.Fatalf("codexsim.New: %v", err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("codexsim Close: %v", err)
		}
		ts.Close()
	})
	return &Sim{Server: s, URL: ts.URL}
}

// ResponsesURL is the emulator's ChatGPT-style Responses WebSocket.
func (s *Sim) ResponsesURL() string {
	return "ws" + strings.TrimPrefix(s.URL, "http") + codexsim.ChatGPTPath
}

// Config returns a data-plane configuration in front of the emulator: its
// Responses WebSocket and token endpoint, the credentials in authFile (see
// WriteAuth), an API listener on a free loopback port. Every other field
// has its default, as clodex-dataplane with no other flag.
func (s *Sim) Config(authFile string) node.Config {
	return node.Config{
		Listen:        "127.0.0.1:0",
		UpstreamURL:   s.ResponsesURL(),
		TokenEndpoint: s.URL + "/oauth/token",
		CodexAuth:     authFile,
	}
}

// WriteAuth writes a Codex auth.json holding accessToken for accountID
// (and refreshToken when not empty), mode 0600, and returns its path.
func WriteAuth(t testing.TB, accessToken, accountID, refreshToken string) string {
	t.Helper()
	tokens := map[string]string{"access_token": accessToken, "account_id": accountID}
	if refreshToken != "" {
		tokens["refresh_token"] = refreshToken
	}
	b, err := json.Marshal(map[string]any{"auth_mode": "chatgpt", "tokens": tokens})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Node is a running data plane.
type Node struct {
	*node.Node
	// URL is the API's base, http://ADDR (Claude Code's ANTHROPIC_BASE_URL).
	URL string
	// Logs holds what the data plane wrote to stderr (its log and notices);
	// the test logs it when it fails.
	Logs *Buffer

	cancel context.CancelFunc
	served chan error
	once   sync.Once
}

// Start starts the data plane with cfg and serves it until Stop or t's
// cleanup.
func Start(t testing.TB, cfg node.Config) *Node {
	t.Helper()
	logs := &Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("data plane stderr:\n%s", logs.String())
		}
	})
	n, err := node.Start(t.Context(), cfg, io.Discard, logs)
	if err != nil {
		t.Fatalf("node.Start: %v\nstderr:\n%s", err, logs.String())
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	tn := &Node{Node: n, URL: "http://" + n.Addr(), Logs: logs, cancel: cancel, served: make(chan error, 1)}
	go func() { tn.served <- n.Serve(ctx) }()
	t.Cleanup(func() { tn.Stop(t) })
	return tn
}

// Stop shuts the data plane down (node.Node.Close) and waits for Serve to
// return; later calls do nothing.
func (n *Node) Stop(t testing.TB) {
	t.Helper()
	n.once.Do(func() {
		n.cancel()
		if err := <-n.served; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("node Serve: %v", err)
		}
	})
}

// Buffer is a bytes.Buffer safe for concurrent writers.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
