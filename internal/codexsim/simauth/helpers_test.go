package simauth

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a manually advanced clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to the start time plus d.
func (c *fakeClock) Set(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = newFakeClock().now.Add(d)
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// testEnv is an Authority behind a real loopback HTTP server.
type testEnv struct {
	a     *Authority
	clock *fakeClock
	srv   *httptest.Server
}

func newEnv(t *testing.T, cfg Config) *testEnv {
	t.Helper()
	clk := newFakeClock()
	if cfg.Clock == nil {
		cfg.Clock = clk.Now
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return &testEnv{a: a, clock: clk, srv: srv}
}

// reply is a decoded HTTP answer.
type reply struct {
	status int
	raw    string
	body   map[string]any
}

func (e *testEnv) do(t *testing.T, method, path, contentType, body string, header http.Header) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	r := reply{status: resp.StatusCode, raw: string(raw)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("%s %s: body is not a JSON object: %v\n%s", method, path, err, raw)
		}
	}
	return r
}

func (e *testEnv) postForm(t *testing.T, path string, v url.Values) reply {
	t.Helper()
	return e.do(t, http.MethodPost, path, "application/x-www-form-urlencoded", v.Encode(), nil)
}

func (e *testEnv) postJSON(t *testing.T, path string, v any) reply {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return e.do(t, http.MethodPost, path, "application/json", string(b), nil)
}

// refresh performs a form-encoded refresh_token grant, as clodex does.
func (e *testEnv) refresh(t *testing.T, rt string) reply {
	t.Helper()
	return e.postForm(t, "/oauth/token", url.Values{
		"grant_type":    {"refresh_token"},
		"refresh_token": {rt},
		"client_id":     {"app_EMoamEEZ73f0CkXaXp7hrann"},
	})
}

func str(t *testing.T, m map[string]any, key string) string {
	t.Helper()
	s, ok := m[key].(string)
	if !ok {
		t.Fatalf("field %q = %#v, want a string", key, m[key])
	}
	return s
}

// codexRefreshErrorCode extracts the refresh failure code the way Codex CLI
// (codex-rs core auth.rs extract_refresh_token_error_code) does: error.code
// when error is an object, error itself when it is a string, else top-level
// code.
func codexRefreshErrorCode(body string) string {
	var m map[string]any
	if json.Unmarshal([]byte(body), &m) != nil {
		return ""
	}
	switch e := m["error"].(type) {
	case map[string]any:
		if c, ok := e["code"].(string); ok {
			return c
		}
	case string:
		return e
	}
	c, _ := m["code"].(string)
	return c
}

// jwtPart decodes segment i (0 header, 1 payload) of a compact JWS.
func jwtPart(t *testing.T, tok string, i int) map[string]any {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token has %d segments, want 3", len(parts))
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[i])
	if err != nil {
		t.Fatalf("segment %d is not base64url: %v", i, err)
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("segment %d is not JSON: %v", i, err)
	}
	return m
}

// reencode replaces segment i of tok with the JSON of m, keeping the others.
func reencode(t *testing.T, tok string, i int, m map[string]any) string {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	parts := strings.Split(tok, ".")
	parts[i] = base64.RawURLEncoding.EncodeToString(b)
	return strings.Join(parts, ".")
}
