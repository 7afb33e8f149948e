package simauth

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAccountsCheck(t *testing.T) {
	e := newEnv(t, Config{TokenTTL: time.Minute, Accept: map[string]string{"static-token": "acct-static"}})
	tok := issue(t, e.a, "acct-test")
	bearer := func(s string) http.Header { return http.Header{"Authorization": {"Bearer " + s}} }

	r := e.do(t, http.MethodGet, "/backend-api/wham/accounts/check", "", "", bearer(tok.AccessToken))
	if r.status != http.StatusOK {
		t.Fatalf("status %d, want 200; body %s", r.status, r.raw)
	}
	// As captured from Codex CLI 0.171.0 (internal/captures/codex/codex-0.171.0-chatgpt-side-endpoints.json).
	want := `{"accounts":[{"id":"acct-test","plan_type":"pro","structure":"personal","workspace_backend_origin":"NO_CONSTRAINT","account_routing_override":"NO_CONSTRAINT","name":null,"profile_picture_url":null}],"account_ordering":["acct-test"],"default_account_id":"acct-test"}`
	if got := strings.TrimSpace(r.raw); got != want {
		t.Errorf("body =\n%s\nwant\n%s", got, want)
	}

	if r := e.do(t, http.MethodGet, "/backend-api/wham/accounts/check", "", "", bearer("static-token")); r.status != http.StatusOK ||
		!strings.Contains(r.raw, `"default_account_id":"acct-static"`) {
		t.Errorf("configured token: status %d body %s, want 200 for acct-static", r.status, r.raw)
	}

	tests := []struct {
		name     string
		header   http.Header
		wantCode string
	}{
		{"no header", nil, "missing_authorization"},
		{"basic scheme", http.Header{"Authorization": {"Basic abc"}}, "missing_authorization"},
		{"empty bearer", http.Header{"Authorization": {"Bearer "}}, "missing_authorization"},
		{"id token", bearer(tok.IDToken), "invalid_token"},
		{"garbage", bearer("xyz"), "invalid_token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do(t, http.MethodGet, "/backend-api/wham/accounts/check", "", "", tt.header)
			if r.status != http.StatusUnauthorized || codexRefreshErrorCode(r.raw) != tt.wantCode {
				t.Errorf("status %d body %s, want 401 %s", r.status, r.raw, tt.wantCode)
			}
		})
	}

	t.Run("expired", func(t *testing.T) {
		e.clock.Advance(time.Minute)
		r := e.do(t, http.MethodGet, "/backend-api/wham/accounts/check", "", "", bearer(tok.AccessToken))
		if r.status != http.StatusUnauthorized || codexRefreshErrorCode(r.raw) != "token_expired" {
			t.Errorf("status %d body %s, want 401 token_expired", r.status, r.raw)
		}
	})
}

func TestWriteUnauthorized(t *testing.T) {
	tests := []struct {
		err      error
		wantCode string
	}{
		{ErrExpired, "token_expired"},
		{errors.Join(errors.New("check exp"), ErrExpired), "token_expired"},
		{ErrInvalid, "invalid_token"},
		{errors.New("other"), "invalid_token"},
	}
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		WriteUnauthorized(rec, tt.err)
		if rec.Code != http.StatusUnauthorized || codexRefreshErrorCode(rec.Body.String()) != tt.wantCode {
			t.Errorf("WriteUnauthorized(%v): %d %s, want 401 %s", tt.err, rec.Code, rec.Body, tt.wantCode)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type = %q, want application/json", ct)
		}
	}
}

func TestTokenEndpointBadInput(t *testing.T) {
	e := newEnv(t, Config{})
	form := "application/x-www-form-urlencoded"
	tests := []struct {
		name        string
		contentType string
		body        string
		wantStatus  int
		wantCode    string
		wantParam   string
	}{
		{"empty form", form, "", 400, "invalid_request", "grant_type"},
		{"unknown grant", form, "grant_type=password", 400, "unsupported_grant_type", "grant_type"},
		{"refresh without token", form, "grant_type=refresh_token&client_id=x", 400, "invalid_request", "refresh_token"},
		{"refresh without client", form, "grant_type=refresh_token&refresh_token=rt_x", 400, "invalid_request", "client_id"},
		{"blank token", form, "grant_type=refresh_token&refresh_token=%20&client_id=x", 400, "invalid_request", "refresh_token"},
		{"bad form", form, "grant_type=%zz", 400, "invalid_request", ""},
		{"malformed json", "application/json", `{"grant_type":`, 400, "invalid_request", ""},
		{"json array", "application/json", `["refresh_token"]`, 400, "invalid_request", ""},
		{"json null", "application/json", `null`, 400, "invalid_request", ""},
		{"json number param", "application/json", `{"grant_type":"refresh_token","refresh_token":5,"client_id":"x"}`, 400, "invalid_request", "refresh_token"},
		{"text body", "text/plain", "grant_type=refresh_token", 415, "invalid_request", "Content-Type"},
		{"bad content type", "application/", "x", 400, "invalid_request", "Content-Type"},
		{"too large form", form, "grant_type=refresh_token&refresh_token=" + strings.Repeat("a", maxBodyBytes), 413, "request_too_large", ""},
		{"too large json", "application/json", `{"refresh_token":"` + strings.Repeat("a", maxBodyBytes) + `"}`, 413, "request_too_large", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do(t, http.MethodPost, "/oauth/token", tt.contentType, tt.body, nil)
			if r.status != tt.wantStatus {
				t.Fatalf("status %d, want %d; body %s", r.status, tt.wantStatus, r.raw)
			}
			if got := codexRefreshErrorCode(r.raw); got != tt.wantCode {
				t.Errorf("code = %q, want %q; body %s", got, tt.wantCode, r.raw)
			}
			if got := errParam(r); got != tt.wantParam {
				t.Errorf("param = %q, want %q; body %s", got, tt.wantParam, r.raw)
			}
			msg := r.body["error"].(map[string]any)["message"].(string)
			if tt.wantParam != "" && !strings.Contains(msg, tt.wantParam) {
				t.Errorf("message %q does not name %s", msg, tt.wantParam)
			}
		})
	}
}

func TestDeviceStartBadInput(t *testing.T) {
	e := newEnv(t, Config{})
	tests := []struct {
		name, contentType, body string
		wantStatus              int
		wantParam               string
	}{
		{"missing client_id", "application/json", `{}`, 400, "client_id"},
		{"not json", "application/json", `client_id=x`, 400, ""},
		{"form body", "application/x-www-form-urlencoded", `client_id=x`, 415, "Content-Type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do(t, http.MethodPost, "/api/accounts/deviceauth/usercode", tt.contentType, tt.body, nil)
			if r.status != tt.wantStatus || errParam(r) != tt.wantParam {
				t.Errorf("status %d param %q, want %d %q; body %s", r.status, errParam(r), tt.wantStatus, tt.wantParam, r.raw)
			}
		})
	}
}

func TestRoutesMethods(t *testing.T) {
	e := newEnv(t, Config{})
	tests := []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/oauth/token", http.StatusMethodNotAllowed},
		{http.MethodGet, "/api/accounts/deviceauth/usercode", http.StatusMethodNotAllowed},
		{http.MethodPost, "/backend-api/wham/accounts/check", http.StatusMethodNotAllowed},
		{http.MethodGet, "/no/such/path", http.StatusNotFound},
	}
	for _, tt := range tests {
		if r := e.do(t, tt.method, tt.path, "", "", nil); r.status != tt.want {
			t.Errorf("%s %s: status %d, want %d", tt.method, tt.path, r.status, tt.want)
		}
	}
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLogsHaveNoTokens runs every flow with debug logging and checks that no
// token, code or verifier reaches the log.
func TestLogsHaveNoTokens(t *testing.T) {
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newEnv(t, Config{Logger: logger, TokenTTL: time.Minute})
	var secrets []string
	keep := func(r reply, keys ...string) {
		for _, k := range keys {
			secrets = append(secrets, str(t, r.body, k))
		}
	}

	id, code := startLogin(t, e)
	poll(t, e, id, code)
	g := poll(t, e, id, code)
	keep(g, "authorization_code", "code_verifier")
	tr := exchange(t, e, str(t, g.body, "authorization_code"), str(t, g.body, "code_verifier"))
	keep(tr, "access_token", "refresh_token", "id_token")
	r1 := e.refresh(t, str(t, tr.body, "refresh_token"))
	keep(r1, "access_token", "refresh_token", "id_token")
	e.refresh(t, str(t, tr.body, "refresh_token")) // reuse
	e.refresh(t, "rt_unknown-secret")
	secrets = append(secrets, "rt_unknown-secret")
	e.clock.Advance(time.Minute)
	e.do(t, http.MethodGet, "/backend-api/wham/accounts/check", "", "",
		http.Header{"Authorization": {"Bearer " + str(t, r1.body, "access_token")}})
	path := t.TempDir() + "/auth.json"
	if err := e.a.WriteAuthFile(path, "acct-log"); err != nil {
		t.Fatal(err)
	}
	e.do(t, http.MethodPost, "/oauth/token", "application/x-www-form-urlencoded",
		url.Values{"grant_type": {"authorization_code"}, "code": {"ac_bogus-secret"}, "code_verifier": {"v"}, "redirect_uri": {deviceCallback}, "client_id": {ClientID}}.Encode(), nil)
	secrets = append(secrets, "ac_bogus-secret")

	out := logs.String()
	if !strings.Contains(out, "refresh token reuse detected") || !strings.Contains(out, `"family":"fam_`) {
		t.Fatalf("logs lack the reuse record with a family id:\n%s", out)
	}
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("log contains a secret (%d chars):\n%s", len(s), out)
		}
	}
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %s", line)
		}
		if m["component"] != "codexsim/simauth" {
			t.Errorf("log line lacks component=codexsim/simauth: %s", line)
		}
	}
}
