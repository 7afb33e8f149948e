package codexsim

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// readErr reads c until it fails and returns the error: a socket closed
// by the server answers its close frame inside this read.
func readErr(ctx context.Context, c *websocket.Conn) <-chan error {
	errc := make(chan error, 1)
	go func() {
		for {
			if _, _, err := c.Read(ctx); err != nil {
				errc <- err
				return
			}
		}
	}()
	return errc
}

func TestCloseIdleClosesOnlyTheAccountsIdleSockets(t *testing.T) {
	srv, ts := testServer(t, Config{AcceptTokens: map[string]string{testToken: testAccount, "sk-other": "acct-other"}})
	postCloseIdle := func(body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.URL+CloseIdlePath, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	// idle: one completed response; busy: a stalled response in flight;
	// other: an idle socket of another account.
	idle := mustDial(t, ts)
	send(t, idle, create("#sim reply hi", nil))
	readResponse(t, idle)
	busy := mustDial(t, ts)
	send(t, busy, create("#sim stall", nil))
	if e := readEvent(t, busy); e["type"] != "codex.rate_limits" && e["type"] != "response.created" {
		t.Fatalf("stalled response began with %v", e["type"])
	}
	other, st, err := dial(t.Context(), ts, ChatGPTPath, goodHeaders("sk-other", "acct-other"))
	if err != nil {
		t.Fatalf("dial other account: %d %v", st, err)
	}
	defer func() { _ = other.CloseNow() }()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	idleErr := readErr(ctx, idle)
	status, body := postCloseIdle(`{"account":"` + testAccount + `","code":4000,"reason":"idle too long"}`)
	if status != http.StatusOK || !strings.Contains(body, `"closed":1`) {
		t.Fatalf("POST %s = %d %s, want 200 {\"closed\":1}", CloseIdlePath, status, body)
	}
	err = <-idleErr
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != 4000 || ce.Reason != "idle too long" {
		t.Errorf("idle socket read error = %v, want close 4000 \"idle too long\"", err)
	}
	if s := srv.Stats(); s.IdleSocketsClosed != 1 || s.OpenSockets != 2 {
		t.Errorf("stats idle_sockets_closed=%d open_sockets=%d, want 1 and 2 (busy and other stay)", s.IdleSocketsClosed, s.OpenSockets)
	}

	// The other account's socket still serves responses.
	send(t, other, create("#sim reply still here", nil))
	if e := last(readResponse(t, other)); e["type"] != "response.completed" {
		t.Errorf("other account's socket answered %v, want response.completed", e["type"])
	}

	// drop ends a socket with no close frame.
	dropped := mustDial(t, ts)
	send(t, dropped, create("#sim reply hi", nil)) // once answered, the server holds the socket
	readResponse(t, dropped)
	droppedErr := readErr(ctx, dropped)
	if status, body := postCloseIdle(`{"account":"` + testAccount + `","drop":true}`); status != http.StatusOK || !strings.Contains(body, `"closed":1`) {
		t.Fatalf("POST drop = %d %s, want 200 {\"closed\":1}", status, body)
	}
	if err := <-droppedErr; err == nil || websocket.CloseStatus(err) != -1 {
		t.Errorf("dropped socket read error = %v, want a failure with no close status", err)
	}
	if s := srv.Stats(); s.IdleSocketsClosed != 2 {
		t.Errorf("stats idle_sockets_closed=%d, want 2", s.IdleSocketsClosed)
	}
}

func TestCloseIdleRejectsBadRequests(t *testing.T) {
	_, ts := testServer(t, Config{})
	tests := []struct{ body, want string }{
		{`{}`, "account is required"},
		{`{"account":"a","code":1005}`, "code 1005"},
		{`{"account":"a","code":999}`, "code 999"},
		{`{"account":"a","reason":"` + strings.Repeat("r", 124) + `"}`, "124 bytes"},
		{`{"account":"a","drop":true,"code":1000}`, "drop sends no close frame"},
		{`{"account":"a","acount":"b"}`, "acount"},
		{`not json`, "invalid"},
	}
	for _, tt := range tests {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.URL+CloseIdlePath, strings.NewReader(tt.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), tt.want) {
			t.Errorf("POST %s = %d %s; want 400 naming %q", tt.body, resp.StatusCode, b, tt.want)
		}
	}
}
