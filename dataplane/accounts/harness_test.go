package accounts

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim/simauth"
)

// rfClock is a manually advanced clock shared by the source under test and
// the emulated identity provider.
type rfClock struct {
	mu  sync.Mutex
	now time.Time
}

var rfStart = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func (c *rfClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to rfStart plus d.
func (c *rfClock) Set(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = rfStart.Add(d)
}

// syncBuffer is a goroutine-safe log sink.
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

// rfHarness is a real simauth Authority behind a loopback HTTP server, a
// Codex auth.json it issued, and the sinks a RefreshingFile reports to.
// At cleanup it checks that no token it ever saw reached the logs or the
// notices.
type rfHarness struct {
	clock   *rfClock
	auth    *simauth.Authority
	srv     *httptest.Server
	path    string
	logs    *syncBuffer
	calls   atomic.Int64 // requests to /oauth/token
	failing atomic.Int32 // when non-zero, /oauth/token answers this status

	mu      sync.Mutex // guards the following fields
	notices []string
	seen    map[string]bool // every token read from the file or returned
}

func newHarness(t *testing.T, cfg simauth.Config) *rfHarness {
	t.Helper()
	h := &rfHarness{clock: &rfClock{now: rfStart}, logs: &syncBuffer{}, seen: make(map[string]bool)}
	cfg.Clock = h.clock.Now
	a, err := simauth.New(cfg)
	if err != nil {
		t.Fatalf("simauth.New: %v", err)
	}
	h.auth = a
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/oauth/token" {
			h.calls.Add(1)
			if st := h.failing.Load(); st != 0 {
				http.Error(w, `{"error":{"code":"server_error"}}`, int(st))
				return
			}
		}
		a.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(h.srv.Close)
	h.path = filepath.Join(t.TempDir(), "auth.json")
	if err := a.WriteAuthFile(h.path, "acct-1"); err != nil {
		t.Fatalf("WriteAuthFile: %v", err)
	}
	h.fileTokens(t)
	t.Cleanup(func() {
		h.fileTokens(t)
		h.mu.Lock()
		defer h.mu.Unlock()
		out := h.logs.String() + strings.Join(h.notices, "\n")
		for tok := range h.seen {
			if strings.Contains(out, tok) {
				t.Errorf("a token leaked into the logs or notices:\n%s", out)
				return
			}
		}
	})
	return h
}

// source returns a RefreshingFile on the harness's file; mut may adjust the
// config.
func (h *rfHarness) source(t *testing.T, mut func(*FileConfig)) *RefreshingFile {
	t.Helper()
	cfg := FileConfig{
		Path:          h.path,
		TokenEndpoint: h.srv.URL + "/oauth/token",
		Clock:         h.clock.Now,
		Logger:        slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Notify: func(msg string) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.notices = append(h.notices, msg)
		},
	}
	if mut != nil {
		mut(&cfg)
	}
	s, err := NewFileSource(cfg)
	if err != nil {
		t.Fatalf("NewFileSource: %v", err)
	}
	return s
}

func (h *rfHarness) noticeList() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.notices...)
}

// remember records tokens for the leak check.
func (h *rfHarness) remember(toks ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, tok := range toks {
		if tok != "" {
			h.seen[tok] = true
		}
	}
}

// fileTokens reads the tokens object of the auth.json as plain strings.
func (h *rfHarness) fileTokens(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(h.path)
	if err != nil {
		t.Fatalf("read auth file: %v", err)
	}
	var f struct {
		Tokens map[string]any `json:"tokens"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("decode auth file: %v", err)
	}
	toks := make(map[string]string)
	for k, v := range f.Tokens {
		if s, ok := v.(string); ok {
			toks[k] = s
		}
	}
	h.remember(toks["access_token"], toks["refresh_token"], toks["id_token"])
	return toks
}

// validate presents tok to the emulated ChatGPT accounts check and returns
// the HTTP status.
func (h *rfHarness) validate(t *testing.T, tok codexauth.Secret) int {
	t.Helper()
	h.remember(tok.Reveal())
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, h.srv.URL+"/backend-api/wham/accounts/check", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok.Reveal())
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("accounts check: %v", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// rotateBehindTheLock redeems the file's refresh token directly, as a
// program that ignores the lock would, without writing the file.
func (h *rfHarness) rotateBehindTheLock(t *testing.T) {
	t.Helper()
	rt := h.fileTokens(t)["refresh_token"]
	resp, err := h.srv.Client().PostForm(h.srv.URL+"/oauth/token", map[string][]string{
		"grant_type": {"refresh_token"}, "refresh_token": {rt}, "client_id": {codexauth.DefaultClientID},
	})
	if err != nil {
		t.Fatalf("rotate: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("rotate: HTTP %d", resp.StatusCode)
	}
	var tr map[string]any
	_ = json.Unmarshal(body, &tr)
	for _, v := range tr {
		if s, ok := v.(string); ok && len(s) > 20 {
			h.remember(s)
		}
	}
}

// checkNoSecret fails if err's text holds any token the harness saw.
func (h *rfHarness) checkNoSecret(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	h.fileTokens(t)
	h.mu.Lock()
	defer h.mu.Unlock()
	for tok := range h.seen {
		if strings.Contains(err.Error(), tok) {
			t.Errorf("error %q leaks a token", err)
		}
	}
}

// credOK calls Credential and fails the test on error.
func credOK(t *testing.T, h *rfHarness, s *RefreshingFile) codexauth.Credential {
	t.Helper()
	c, err := s.Credential(t.Context())
	if err != nil {
		h.checkNoSecret(t, err)
		t.Fatalf("Credential: %v", err)
	}
	h.remember(c.AccessToken.Reveal())
	return c
}

func slogJSON(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
