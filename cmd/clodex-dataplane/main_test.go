package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/codexsim"
)

func TestBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"unknown flag", []string{"--nope"}, []string{"flag provided but not defined: -nope", "--help"}},
		{"stray argument", []string{"serve"}, []string{`unexpected argument "serve"`}},
		{"every bad value at once", []string{"--listen", "nocolon", "--upstream-url", "ftp://x", "--log-level", "loud", "--admin-listen", "bad"},
			[]string{"--listen \"nocolon\"", "--upstream-url \"ftp://x\"", "--log-level \"loud\" is invalid; choices are debug, info, warn, error", "--admin-listen \"bad\""}},
		{"network listener without key", []string{"--listen", "0.0.0.0:17645"}, []string{"--api-key-file is required"}},
		{"bad token endpoint", []string{"--token-endpoint", "nope"}, []string{"--token-endpoint"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			err := run(t.Context(), tt.args, &stdout, &stderr)
			if err == nil {
				t.Fatal("run: no error")
			}
			if _, ok := err.(*usageError); !ok {
				t.Errorf("run error %T, want *usageError (exit 2)", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("run error %q, want it to mention %q", err, w)
				}
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
}

func TestMissingAuthFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "auth.json")
	err := run(t.Context(), []string{"--codex-auth", p, "--listen", "127.0.0.1:0"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("run = %v, want an error naming the missing %s", err, p)
	}
}

func TestDefaultCodexAuth(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"CODEX_HOME": "/opt/codex", "HOME": "/home/u"}, "/opt/codex/auth.json"},
		{map[string]string{"HOME": "/home/u"}, "/home/u/.codex/auth.json"},
	}
	for _, tt := range tests {
		if got := defaultCodexAuth(env(tt.env)); got != tt.want {
			t.Errorf("defaultCodexAuth(%v) = %q, want %q", tt.env, got, tt.want)
		}
	}
}

func TestVersion(t *testing.T) {
	var out strings.Builder
	if err := run(t.Context(), []string{"--version"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if out.String() != "clodex-dataplane dev\n" {
		t.Errorf("--version printed %q, want \"clodex-dataplane dev\\n\"", out.String())
	}
}

// lineWriter hands the first line written to stdout to the test.
type lineWriter struct{ lines chan string }

func (w *lineWriter) Write(b []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		select {
		case w.lines <- l:
		default:
		}
	}
	return len(b), nil
}

// A happy start and stop: run serves a real turn through clodex-sim, then
// shuts down cleanly when its context ends.
func TestStartServeStop(t *testing.T) {
	sim, err := codexsim.New(codexsim.Config{AcceptTokens: map[string]string{"tok-cmd": "acct-cmd"}})
	if err != nil {
		t.Fatal(err)
	}
	simTS := httptest.NewServer(sim.Handler())
	defer simTS.Close()
	defer sim.Close()
	auth := filepath.Join(t.TempDir(), "auth.json")
	os.WriteFile(auth, []byte(`{"auth_mode":"chatgpt","tokens":{"access_token":"tok-cmd","account_id":"acct-cmd"}}`), 0o600)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stdout := &lineWriter{lines: make(chan string, 1)}
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{
			"--listen", "127.0.0.1:0",
			"--admin-listen", "127.0.0.1:0",
			"--codex-auth", auth,
			"--upstream-url", "ws" + strings.TrimPrefix(simTS.URL, "http") + codexsim.ChatGPTPath,
			"--token-endpoint", simTS.URL + "/oauth/token",
			"--log-level", "error",
		}, stdout, io.Discard)
	}()
	var line string
	select {
	case line = <-stdout.lines:
	case err := <-errc:
		t.Fatalf("run exited early: %v", err)
	}
	base, _, ok := strings.Cut(strings.TrimPrefix(line, "export ANTHROPIC_BASE_URL="), "  #")
	if !strings.HasPrefix(line, "export ANTHROPIC_BASE_URL=http://127.0.0.1:") || !ok || !strings.Contains(line, "any ANTHROPIC_API_KEY works on loopback") {
		t.Fatalf("first stdout line = %q, want the export line for Claude Code", line)
	}

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/messages?beta=true",
		strings.NewReader(`{"model":"gpt-5.5","max_tokens":100,"messages":[{"role":"user","content":"#sim reply through the binary"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", "anything")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var msg struct{ Content []struct{ Text string } }
	json.NewDecoder(resp.Body).Decode(&msg)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(msg.Content) != 1 || msg.Content[0].Text != "through the binary" {
		t.Errorf("POST /v1/messages = %d %+v, want 200 \"through the binary\"", resp.StatusCode, msg)
	}

	cancel()
	if err := <-errc; err != nil {
		t.Errorf("run after cancel = %v, want nil", err)
	}
}

// On shutdown a turn still in flight after --shutdown-grace is ended: the
// client gets 503 and the upstream socket is closed (the sim sees it go).
func TestShutdownEndsStalledTurn(t *testing.T) {
	sim, err := codexsim.New(codexsim.Config{AcceptTokens: map[string]string{"tok-cmd": "acct-cmd"}})
	if err != nil {
		t.Fatal(err)
	}
	simTS := httptest.NewServer(sim.Handler())
	defer simTS.Close()
	defer sim.Close()
	auth := filepath.Join(t.TempDir(), "auth.json")
	os.WriteFile(auth, []byte(`{"auth_mode":"chatgpt","tokens":{"access_token":"tok-cmd","account_id":"acct-cmd"}}`), 0o600)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stdout := &lineWriter{lines: make(chan string, 1)}
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"--listen", "127.0.0.1:0", "--codex-auth", auth, "--shutdown-grace", "50ms", "--log-level", "error",
			"--upstream-url", "ws" + strings.TrimPrefix(simTS.URL, "http") + codexsim.ChatGPTPath}, stdout, io.Discard)
	}()
	line := <-stdout.lines
	base, _, _ := strings.Cut(strings.TrimPrefix(line, "export ANTHROPIC_BASE_URL="), "  #")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/messages",
		strings.NewReader(`{"model":"gpt-5.5","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"#sim stall"}]}`))
	req.Header.Set("Content-Type", "application/json")
	respc := make(chan *http.Response, 1)
	go func() {
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Errorf("POST: %v", err)
		}
		respc <- resp
	}()
	for sim.Stats().Responses == 0 { // the turn is in flight upstream
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	resp := <-respc
	if resp != nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "shutting down") {
			t.Errorf("in-flight turn got %d %s, want 503 naming the shutdown", resp.StatusCode, body)
		}
	}
	if err := <-errc; err != nil {
		t.Errorf("run = %v, want nil", err)
	}
	for sim.Stats().OpenSockets != 0 {
		time.Sleep(5 * time.Millisecond)
	}
}

// The binary must not depend on the control plane or on test packages.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/clodex/clodex/controlplane") || dep == "testing" ||
			strings.HasPrefix(dep, "github.com/clodex/clodex/internal/codexsim") {
			t.Errorf("clodex-dataplane imports %s", dep)
		}
	}
}
