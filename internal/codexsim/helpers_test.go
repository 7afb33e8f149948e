package codexsim

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	testToken   = "sk-test-token"
	testAccount = "acct-test"
)

// fakeClock is a manually advanced clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testServer starts a Server behind a loopback httptest server; both are
// closed when the test ends.
func testServer(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	if cfg.AcceptTokens == nil {
		cfg.AcceptTokens = map[string]string{testToken: testAccount}
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		_ = srv.Close()
		ts.Close()
	})
	return srv, ts
}

func wsURL(ts *httptest.Server, path string) string {
	return "ws" + strings.TrimPrefix(ts.URL, "http") + path
}

// goodHeaders are the upgrade headers a well-behaved ChatGPT-mode client sends.
func goodHeaders(token, account string) http.Header {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token)
	if account != "" {
		h.Set("chatgpt-account-id", account)
	}
	h.Set("OpenAI-Beta", BetaHeaderValue)
	return h
}

// dial opens a socket; it returns the HTTP status of a refused upgrade.
func dial(ctx context.Context, ts *httptest.Server, path string, h http.Header) (*websocket.Conn, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, wsURL(ts, path), &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
			resp.Body.Close()
		}
		return nil, status, err
	}
	c.SetReadLimit(64 << 20)
	return c, http.StatusSwitchingProtocols, nil
}

// mustDial opens a ChatGPT-path socket for the test account.
func mustDial(t *testing.T, ts *httptest.Server) *websocket.Conn {
	t.Helper()
	c, status, err := dial(t.Context(), ts, ChatGPTPath, goodHeaders(testToken, testAccount))
	if err != nil {
		t.Fatalf("dial: status %d: %v", status, err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

func send(t *testing.T, c *websocket.Conn, frame any) {
	t.Helper()
	var b []byte
	switch f := frame.(type) {
	case string:
		b = []byte(f)
	case []byte:
		b = f
	default:
		var err error
		if b, err = json.Marshal(f); err != nil {
			t.Fatalf("marshal frame: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatalf("write frame: %v", err)
	}
}

type event = map[string]any

func readEvent(t *testing.T, c *websocket.Conn) event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	typ, b, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read event: %v", err)
	}
	if typ != websocket.MessageText {
		t.Fatalf("event frame type = %v, want text", typ)
	}
	var e event
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("event is not JSON: %v: %s", err, b)
	}
	return e
}

// isTerminal reports whether e ends a response.
func isTerminal(e event) bool {
	switch e["type"] {
	case "response.completed", "response.failed", "response.incomplete", "error":
		return true
	}
	return false
}

// readResponse reads events up to and including a terminal one.
func readResponse(t *testing.T, c *websocket.Conn) []event {
	t.Helper()
	var evs []event
	for {
		e := readEvent(t, c)
		evs = append(evs, e)
		if isTerminal(e) {
			return evs
		}
		if len(evs) > 10000 {
			t.Fatalf("no terminal event after %d events", len(evs))
		}
	}
}

func types(evs []event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i], _ = e["type"].(string)
	}
	return out
}

// collapse drops codex.* side events and merges runs of the same delta type,
// so sequences compare independently of how text is split.
func collapse(ts []string) []string {
	var out []string
	for _, t := range ts {
		if strings.HasPrefix(t, "codex.") {
			continue
		}
		if strings.HasSuffix(t, ".delta") && len(out) > 0 && out[len(out)-1] == t {
			continue
		}
		out = append(out, t)
	}
	return out
}

func last(evs []event) event { return evs[len(evs)-1] }

// create builds a response.create frame with one user message.
func create(text string, extra map[string]any) map[string]any {
	f := map[string]any{
		"type":   "response.create",
		"model":  "gpt-5.5",
		"stream": true,
		"store":  false,
		"input": []any{map[string]any{"type": "message", "role": "user",
			"content": []any{map[string]any{"type": "input_text", "text": text}}}},
	}
	for k, v := range extra {
		f[k] = v
	}
	return f
}

func responseOf(t *testing.T, e event) map[string]any {
	t.Helper()
	r, ok := e["response"].(map[string]any)
	if !ok {
		t.Fatalf("%v has no response object: %v", e["type"], e)
	}
	return r
}

func errorOf(t *testing.T, e event) map[string]any {
	t.Helper()
	if e["type"] != "error" {
		t.Fatalf("event type = %v, want error: %v", e["type"], e)
	}
	r, ok := e["error"].(map[string]any)
	if !ok {
		t.Fatalf("error frame has no error object: %v", e)
	}
	return r
}

func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

// usage returns input, cached, output, reasoning and total tokens.
func usage(t *testing.T, e event) (in, cached, out, reasoning, total int64) {
	t.Helper()
	u, ok := responseOf(t, e)["usage"].(map[string]any)
	if !ok {
		t.Fatalf("no usage in %v", e)
	}
	in = num(u["input_tokens"])
	cached = num(u["input_tokens_details"].(map[string]any)["cached_tokens"])
	out = num(u["output_tokens"])
	reasoning = num(u["output_tokens_details"].(map[string]any)["reasoning_tokens"])
	total = num(u["total_tokens"])
	return
}

func closeStatus(err error) websocket.StatusCode {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return -1
}

func newHTTPServer(t *testing.T, srv *Server) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		_ = srv.Close()
		ts.Close()
	})
	return ts
}
