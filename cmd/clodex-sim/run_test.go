package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRunBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "-bogus"},
		{[]string{"--upgrade-limit", "x"}, "upgrade-limit"},
		{[]string{"--upgrade-limit", "-1"}, "--upgrade-limit -1 is invalid"},
		{[]string{"--upgrade-window", "soon"}, "upgrade-window"},
		{[]string{"--accept-token", "nokey"}, "TOKEN=ACCOUNT_ID"},
		{[]string{"--token-ttl", "10ms"}, "--token-ttl 10ms is invalid"},
		{[]string{"--upgrade-5xx-share", "2"}, "--upgrade-5xx-share 2 is invalid"},
		{[]string{"--auth-account", "bad account!"}, "--auth-account"},
		{[]string{"--log-level", "loud"}, "log-level"},
		{[]string{"extra"}, "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errOut strings.Builder
			err := run(t.Context(), tt.args, &out, &errOut)
			var ue *usageError
			if !errors.As(err, &ue) {
				t.Fatalf("run(%q) = %v, want a usage error", tt.args, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %q", err, tt.want)
			}
		})
	}
}

func TestRunHelpAndVersion(t *testing.T) {
	var out strings.Builder
	if err := run(t.Context(), []string{"--help"}, &out, io.Discard); err != nil {
		t.Fatalf("--help: %v", err)
	}
	if !strings.Contains(out.String(), "-upgrade-limit") || !strings.Contains(out.String(), "-write-auth") {
		t.Errorf("--help output lacks flags:\n%s", out.String())
	}
	out.Reset()
	if err := run(t.Context(), []string{"--version"}, &out, io.Discard); err != nil || !strings.HasPrefix(out.String(), "clodex-sim ") {
		t.Errorf("--version: %q, %v", out.String(), err)
	}
}

// TestRunServes starts the binary's run on a free port, uses the printed
// URL and the written auth.json, then shuts it down.
func TestRunServes(t *testing.T) {
	authPath := filepath.Join(t.TempDir(), "codex", "auth.json")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--write-auth", authPath, "--accept-token", "tok-1=acct-1",
			"--upgrade-limit", "1", "--log-level", "error"}, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("read ready line: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }() // ends when run returns and closes pw
	wsu := strings.TrimSpace(line)
	if !strings.HasPrefix(wsu, "ws://127.0.0.1:") || !strings.HasSuffix(wsu, "/backend-api/codex/responses") {
		t.Fatalf("ready line %q, want ws://ADDR/backend-api/codex/responses", line)
	}
	base := "http://" + strings.TrimSuffix(strings.TrimPrefix(wsu, "ws://"), "/backend-api/codex/responses")

	st, err := os.Stat(authPath)
	if err != nil {
		t.Fatalf("auth file: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("auth file mode %v, want 0600", st.Mode().Perm())
	}
	var auth struct {
		AuthMode string `json:"auth_mode"`
		Tokens   struct {
			AccessToken  string `json:"access_token"`
			RefreshToken string `json:"refresh_token"`
			AccountID    string `json:"account_id"`
		} `json:"tokens"`
	}
	b, _ := os.ReadFile(authPath)
	if err := json.Unmarshal(b, &auth); err != nil || auth.AuthMode != "chatgpt" || auth.Tokens.AccountID != "acct-sim" {
		t.Fatalf("auth file %s: %v", b, err)
	}

	// The written token opens a socket on the printed URL.
	h := http.Header{}
	h.Set("Authorization", "Bearer "+auth.Tokens.AccessToken)
	h.Set("chatgpt-account-id", auth.Tokens.AccountID)
	h.Set("OpenAI-Beta", "responses_websockets=2026-02-06")
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	c, _, err := websocket.Dial(dctx, wsu, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatalf("dial %s with the written token: %v", wsu, err)
	}
	if err := c.Write(dctx, websocket.MessageText, []byte(`{"type":"response.create","model":"m","input":[{"role":"user","content":"#sim reply ok"}]}`)); err != nil {
		t.Fatal(err)
	}
	for {
		_, data, err := c.Read(dctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if strings.Contains(string(data), `"type":"response.completed"`) {
			break
		}
	}
	// The configured token works on the API-key path; --upgrade-limit 1
	// applies per account.
	h2 := http.Header{}
	h2.Set("Authorization", "Bearer tok-1")
	h2.Set("OpenAI-Beta", "responses_websockets=2026-02-06")
	c2, _, err := websocket.Dial(dctx, strings.Replace(wsu, "/backend-api/codex/responses", "/v1/responses", 1), &websocket.DialOptions{HTTPHeader: h2})
	if err != nil {
		t.Fatalf("dial with --accept-token: %v", err)
	}
	_ = c2.CloseNow() // only releases the socket: --upgrade-limit counts upgrades
	if _, resp, err := websocket.Dial(dctx, wsu, &websocket.DialOptions{HTTPHeader: h}); err == nil || resp == nil || resp.StatusCode != 403 {
		t.Errorf("second acct-sim upgrade with --upgrade-limit 1: %v, want 403", err)
	}

	// The token endpoint refreshes the written refresh token.
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {auth.Tokens.RefreshToken}, "client_id": {"app_EMoamEEZ73f0CkXaXp7hrann"}}
	req, _ := http.NewRequestWithContext(dctx, "POST", base+"/oauth/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("POST /oauth/token: %d", resp.StatusCode)
	}

	// Shutdown closes the open socket with 1001.
	cancel()
	_, _, err = c.Read(context.Background())
	if websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Errorf("socket at shutdown: %v, want close 1001", err)
	}
	if err := <-done; err != nil {
		t.Errorf("run after shutdown: %v", err)
	}
	http.DefaultClient.CloseIdleConnections()
}
