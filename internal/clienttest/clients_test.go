package clienttest_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/clodex/clodex/internal/clienttest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// wantCacheDir is where the clients must be cached, computed independently
// of the package.
func wantCacheDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("CLODEX_CLIENT_CACHE"); d != "" {
		abs, err := filepath.Abs(d)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(home, ".cache", "clodex", "clients")
}

func TestClientsInstalledAtPinnedVersions(t *testing.T) {
	tests := []struct {
		name    string
		get     func(testing.TB) string
		wantDir string
		version string
	}{
		{name: "claude", get: clienttest.ClaudeCode, wantDir: "claude-code-2.1.332", version: "2.1.332"},
		{name: "codex", get: clienttest.CodexCLI, wantDir: "codex-0.171.0", version: "0.171.0"},
		{name: "opencode", get: clienttest.Opencode, wantDir: "opencode-1.18.33", version: "1.18.33"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := tt.get(t)
			want := filepath.Join(wantCacheDir(t), tt.wantDir, "node_modules", ".bin", tt.name)
			if bin != want {
				t.Errorf("client path = %q, want %q", bin, want)
			}
			cmd := exec.CommandContext(t.Context(), bin, "--version")
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "CODEX_HOME=" + t.TempDir(), "DISABLE_AUTOUPDATER=1"}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s --version: %v: %s", bin, err, out)
			}
			if !strings.Contains(string(out), tt.version) {
				t.Errorf("%s --version = %q, want it to contain %s", bin, out, tt.version)
			}
			if again := tt.get(t); again != bin {
				t.Errorf("second call = %q, want %q", again, bin)
			}
		})
	}
}

// The client libraries are installed in a folder named by their lock file's digest, each
// package at its pinned version.
func TestNodeLibrariesInstalledAtPinnedVersions(t *testing.T) {
	lock, err := os.ReadFile("nodelibs/package-lock.json")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	libs := clienttest.NodeLibraries(t)
	if want := filepath.Join(wantCacheDir(t), "node-libs-"+hex.EncodeToString(sum[:6]), "node_modules"); libs != want {
		t.Errorf("libraries path = %q, want %q", libs, want)
	}
	for pkg, version := range map[string]string{"ai": "7.0.173", "@ai-sdk/anthropic": "4.0.105", "@anthropic-ai/claude-agent-sdk": "0.3.333",
		"@langchain/anthropic": "1.5.11", "@langchain/core": "1.4.0", "zod": "4.6.7"} {
		b, err := os.ReadFile(filepath.Join(libs, pkg, "package.json"))
		var got struct{ Version string }
		if err != nil || json.Unmarshal(b, &got) != nil || got.Version != version {
			t.Errorf("%s: installed %q (%v), want %s", pkg, got.Version, err, version)
		}
	}
	// The Agent SDK's bundled Claude Code (an optional platform package) is left out: the
	// tests hand it the pinned one.
	if _, err := os.Stat(filepath.Join(libs, "@anthropic-ai", "claude-agent-sdk-linux-x64")); !os.IsNotExist(err) {
		t.Errorf("the Agent SDK's platform binary is installed (%v); want it left out", err)
	}
}

// messagesStub is a minimal Anthropic Messages server that answers every
// streaming POST /v1/messages with a fixed text reply.
type messagesStub struct {
	mu       sync.Mutex
	requests []recordedRequest
}

type recordedRequest struct {
	method, path, query string
	header              http.Header
	body                map[string]any
}

const stubReply = "Hi from the clienttest stub."

func (s *messagesStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(b, &body)
	s.mu.Lock()
	s.requests = append(s.requests, recordedRequest{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery, header: r.Header.Clone(), body: body})
	s.mu.Unlock()
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		http.NotFound(w, r)
		return
	}
	if body["stream"] != true {
		http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"stub streams only"}}`, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(event string, data any) {
		j, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, j)
		w.(http.Flusher).Flush()
	}
	send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": "msg_stub_1", "type": "message", "role": "assistant", "model": body["model"], "content": []any{},
		"stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 42, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1},
	}})
	send("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	for _, piece := range []string{"Hi from", " the clienttest", " stub."} {
		send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": piece}})
	}
	send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	send("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 7}})
	send("message_stop", map[string]any{"type": "message_stop"})
}

func TestRunClaudeTextReply(t *testing.T) {
	bin := clienttest.ClaudeCode(t)
	// Variables of the developer's shell must not reach the client.
	t.Setenv("ANTHROPIC_AUTH_TOKEN", "leaked-token")
	t.Setenv("ANTHROPIC_MODEL", "leaked-model")

	stub := &messagesStub{}
	ts := httptest.NewServer(stub)
	defer ts.Close()

	res := clienttest.RunClaude(t.Context(), t, bin, clienttest.ClaudeRun{
		BaseURL: ts.URL,
		APIKey:  "ck-clienttest",
		Model:   "gpt-5-codex",
		Prompt:  "say hi",
	})
	if res.ExitCode != 0 || res.IsError() {
		t.Fatalf("claude exit %d, is_error %v, result %v\nstderr:\n%s", res.ExitCode, res.IsError(), res.Result, res.Stderr)
	}
	if got := res.Text(); got != stubReply {
		t.Errorf("result text = %q, want %q", got, stubReply)
	}
	var deltas []string
	for _, ev := range res.StreamEvents() {
		if ev["type"] != "content_block_delta" {
			continue
		}
		if d, ok := ev["delta"].(map[string]any); ok && d["type"] == "text_delta" {
			deltas = append(deltas, d["text"].(string))
		}
	}
	if want := []string{"Hi from", " the clienttest", " stub."}; !slices.Equal(deltas, want) {
		t.Errorf("streamed text deltas = %q, want %q", deltas, want)
	}

	stub.mu.Lock()
	defer stub.mu.Unlock()
	if len(stub.requests) != 1 {
		t.Fatalf("stub saw %d requests, want exactly 1 (POST /v1/messages): %+v", len(stub.requests), stub.requests)
	}
	req := stub.requests[0]
	if req.method != http.MethodPost || req.path != "/v1/messages" || req.query != "beta=true" {
		t.Errorf("request = %s %s?%s, want POST /v1/messages?beta=true", req.method, req.path, req.query)
	}
	if got := req.header.Get("X-Api-Key"); got != "ck-clienttest" {
		t.Errorf("x-api-key = %q, want %q", got, "ck-clienttest")
	}
	if got := req.header.Get("Authorization"); got != "" {
		t.Errorf("Authorization = %q, want none (ANTHROPIC_AUTH_TOKEN of the test process must not leak)", got)
	}
	if got := req.header.Get("User-Agent"); !strings.Contains(got, "claude-cli/2.1.332") {
		t.Errorf("User-Agent = %q, want claude-cli/2.1.332", got)
	}
	if got := req.body["model"]; got != "gpt-5-codex" {
		t.Errorf("request model = %v, want gpt-5-codex", got)
	}
}

// responsesStub is a minimal Responses API WebSocket server: every
// response.create gets a fixed text reply (a prewarm gets an empty one).
type responsesStub struct {
	t      *testing.T
	mu     sync.Mutex
	header http.Header
	frames []map[string]any
}

const codexStubReply = "pong from the clienttest stub"

func (s *responsesStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/responses" {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	s.header = r.Header.Clone()
	s.mu.Unlock()
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		s.t.Errorf("accept: %v", err)
		return
	}
	defer func() { _ = c.CloseNow() }()
	c.SetReadLimit(32 << 20)
	ctx := r.Context()
	for n := 1; ; n++ {
		_, data, err := c.Read(ctx)
		if err != nil {
			return // Codex drops the connection at exit
		}
		var f map[string]any
		if err := json.Unmarshal(data, &f); err != nil {
			s.t.Errorf("frame %d is not JSON: %v", n, err)
			return
		}
		s.mu.Lock()
		s.frames = append(s.frames, f)
		s.mu.Unlock()
		id := fmt.Sprintf("resp_stub_%d", n)
		resp := map[string]any{"id": id, "object": "response", "status": "in_progress", "model": f["model"], "output": []any{}}
		seq := 0
		send := func(ev map[string]any) {
			ev["sequence_number"] = seq
			seq++
			j, _ := json.Marshal(ev)
			if err := c.Write(ctx, websocket.MessageText, j); err != nil {
				s.t.Logf("write: %v", err)
			}
		}
		send(map[string]any{"type": "response.created", "response": resp})
		var output []any
		if f["generate"] != false {
			msg := map[string]any{"type": "message", "id": "msg_" + id, "role": "assistant", "status": "completed",
				"content": []any{map[string]any{"type": "output_text", "text": codexStubReply, "annotations": []any{}}}}
			send(map[string]any{"type": "response.output_item.added", "output_index": 0,
				"item": map[string]any{"type": "message", "id": "msg_" + id, "role": "assistant", "status": "in_progress", "content": []any{}}})
			send(map[string]any{"type": "response.output_text.delta", "item_id": "msg_" + id, "output_index": 0, "content_index": 0, "delta": codexStubReply})
			send(map[string]any{"type": "response.output_item.done", "output_index": 0, "item": msg})
			output = []any{msg}
		}
		done := map[string]any{"id": id, "object": "response", "status": "completed", "model": f["model"], "output": output,
			"usage": map[string]any{"input_tokens": 10, "input_tokens_details": map[string]any{"cached_tokens": 0},
				"output_tokens": 5, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 15}}
		send(map[string]any{"type": "response.completed", "response": done})
	}
}

func TestRunCodexWebSocket(t *testing.T) {
	bin := clienttest.CodexCLI(t)
	t.Setenv("OPENAI_API_KEY", "leaked-key")
	stub := &responsesStub{t: t}
	ts := httptest.NewServer(stub)
	defer ts.Close()

	res := clienttest.RunCodex(t.Context(), t, bin, clienttest.CodexRun{
		BaseURL: ts.URL + "/v1",
		APIKey:  "sk-clienttest",
		Prompt:  "say pong",
	})
	if res.ExitCode != 0 {
		t.Fatalf("codex exit %d\nevents: %v\nstderr:\n%s", res.ExitCode, res.Events, res.Stderr)
	}
	if got, want := res.AgentMessages(), []string{codexStubReply}; !slices.Equal(got, want) {
		t.Errorf("agent messages = %q, want %q", got, want)
	}
	if last := res.Events[len(res.Events)-1]; last["type"] != "turn.completed" {
		t.Errorf("last event = %v, want turn.completed", last)
	}

	stub.mu.Lock()
	defer stub.mu.Unlock()
	if got := stub.header.Get("Authorization"); got != "Bearer sk-clienttest" {
		t.Errorf("upgrade Authorization = %q, want %q", got, "Bearer sk-clienttest")
	}
	if got := stub.header.Get("OpenAI-Beta"); got != "responses_websockets=2026-02-06" {
		t.Errorf("upgrade OpenAI-Beta = %q, want responses_websockets=2026-02-06", got)
	}
	if len(stub.frames) != 2 {
		t.Fatalf("stub got %d response.create frames, want 2 (prewarm, turn)", len(stub.frames))
	}
	if stub.frames[0]["generate"] != false {
		t.Errorf("frame 1 generate = %v, want false (prewarm)", stub.frames[0]["generate"])
	}
	if got := stub.frames[1]["previous_response_id"]; got != "resp_stub_1" {
		t.Errorf("frame 2 previous_response_id = %v, want resp_stub_1", got)
	}
}
