package accounts

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim/simauth"
	"github.com/clodex/clodex/internal/filelock"
)

func TestCredentialRefreshesAheadOfExpiry(t *testing.T) {
	tests := []struct {
		name        string
		ttl         time.Duration
		at          time.Duration // time since the file was written
		wantRefresh bool
	}{
		{"fresh token", time.Hour, 0, false},
		{"121s before expiry", time.Hour, time.Hour - 121*time.Second, false},
		{"119s before expiry", time.Hour, time.Hour - 119*time.Second, true},
		{"expired", time.Hour, 2 * time.Hour, true},
		// A 20s token uses a quarter of its lifetime as the margin, not 120s.
		{"20s token, 6s left", 20 * time.Second, 14 * time.Second, false},
		{"20s token, 4s left", 20 * time.Second, 16 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, simauth.Config{TokenTTL: tt.ttl})
			before := h.fileTokens(t)
			s := h.source(t, nil)
			h.clock.Set(tt.at)
			c := credOK(t, h, s)

			after := h.fileTokens(t)
			refreshed := c.AccessToken.Reveal() != before["access_token"]
			if refreshed != tt.wantRefresh {
				t.Errorf("codexauth.Credential at +%v refreshed = %v, want %v", tt.at, refreshed, tt.wantRefresh)
			}
			wantRefreshes := int64(0)
			if tt.wantRefresh {
				wantRefreshes = 1
			}
			if got := h.auth.Stats().TokenRefreshes; got != wantRefreshes {
				t.Errorf("token_refreshes = %d, want %d", got, wantRefreshes)
			}
			if got := h.validate(t, c.AccessToken); got != http.StatusOK {
				t.Errorf("accounts check with the credential = HTTP %d, want 200", got)
			}
			if c.AccountID != "acct-1" {
				t.Errorf("AccountID = %q, want acct-1", c.AccountID)
			}
			if after["access_token"] != c.AccessToken.Reveal() {
				t.Errorf("auth.json access_token is not the token handed out")
			}
			if tt.wantRefresh && after["refresh_token"] == before["refresh_token"] {
				t.Errorf("auth.json refresh_token was not replaced by the rotated one")
			}
		})
	}
}

func TestAdoptsTokenWrittenByAnotherProcess(t *testing.T) {
	h := newHarness(t, simauth.Config{})
	a := h.source(t, nil)
	b := h.source(t, nil) // the "other process": same file, own state
	old := credOK(t, h, a)

	h.clock.Set(time.Hour - time.Minute)
	cb := credOK(t, h, b)
	if got := h.auth.Stats().TokenRefreshes; got != 1 {
		t.Fatalf("token_refreshes after b = %d, want 1", got)
	}
	ca := credOK(t, h, a)
	if ca.AccessToken != cb.AccessToken || ca.AccessToken == old.AccessToken {
		t.Errorf("a did not adopt the token b wrote (same as b: %v, same as old: %v)",
			ca.AccessToken == cb.AccessToken, ca.AccessToken == old.AccessToken)
	}
	st := h.auth.Stats()
	if st.TokenRefreshes != 1 || st.RefreshReuseDetected != 0 {
		t.Errorf("stats = %+v, want 1 refresh and no reuse", st)
	}

	// Much later a refreshes with the refresh token b wrote, not its stale
	// one: no reuse.
	h.clock.Set(2*time.Hour - time.Minute)
	ca2 := credOK(t, h, a)
	if ca2.AccessToken == ca.AccessToken {
		t.Errorf("a did not refresh the second time")
	}
	if st := h.auth.Stats(); st.TokenRefreshes != 2 || st.RefreshReuseDetected != 0 {
		t.Errorf("stats = %+v, want 2 refreshes and no reuse", st)
	}
	if got := h.validate(t, ca2.AccessToken); got != http.StatusOK {
		t.Errorf("accounts check = HTTP %d, want 200", got)
	}
}

func TestRejectedRefreshesOnce(t *testing.T) {
	h := newHarness(t, simauth.Config{})
	s := h.source(t, nil)
	t1 := credOK(t, h, s)

	t2, err := s.Rejected(t.Context(), t1.AccessToken)
	if err != nil {
		t.Fatalf("Rejected: %v", err)
	}
	h.remember(t2.AccessToken.Reveal())
	if t2.AccessToken == t1.AccessToken {
		t.Fatal("Rejected returned the rejected token")
	}
	if got := h.validate(t, t2.AccessToken); got != http.StatusOK {
		t.Errorf("accounts check with the new token = HTTP %d, want 200", got)
	}
	if got := h.auth.Stats().TokenRefreshes; got != 1 {
		t.Errorf("token_refreshes = %d, want 1", got)
	}
	if c := credOK(t, h, s); c.AccessToken != t2.AccessToken {
		t.Errorf("codexauth.Credential after Rejected is not the new token")
	}

	// A late 401 for the old token does not refresh again.
	t2b, err := s.Rejected(t.Context(), t1.AccessToken)
	if err != nil || t2b.AccessToken != t2.AccessToken {
		t.Errorf("Rejected(old token) = same as new %v, %v; want the current token, nil", t2b.AccessToken == t2.AccessToken, err)
	}
	if got := h.auth.Stats().TokenRefreshes; got != 1 {
		t.Errorf("token_refreshes after a late 401 = %d, want 1", got)
	}

	// Eight requests rejected with the same token share one refresh.
	var wg sync.WaitGroup
	got := make([]codexauth.Credential, 8)
	errs := make([]error, 8)
	for i := range got {
		wg.Go(func() { got[i], errs[i] = s.Rejected(t.Context(), t2.AccessToken) })
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i].AccessToken != got[0].AccessToken || got[i].AccessToken == t2.AccessToken {
			t.Errorf("concurrent Rejected #%d: err %v, same as #0 %v, same as rejected %v", i, errs[i],
				got[i].AccessToken == got[0].AccessToken, got[i].AccessToken == t2.AccessToken)
		}
	}
	h.remember(got[0].AccessToken.Reveal())
	if st := h.auth.Stats(); st.TokenRefreshes != 2 || st.RefreshReuseDetected != 0 {
		t.Errorf("stats = %+v, want 2 refreshes and no reuse", st)
	}
}

func TestConcurrentCredentialRefreshesOnce(t *testing.T) {
	h := newHarness(t, simauth.Config{})
	s := h.source(t, nil)
	h.clock.Set(2 * time.Hour) // expired
	var wg sync.WaitGroup
	got := make([]codexauth.Credential, 16)
	errs := make([]error, 16)
	for i := range got {
		wg.Go(func() { got[i], errs[i] = s.Credential(t.Context()) })
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i].AccessToken != got[0].AccessToken {
			t.Errorf("codexauth.Credential #%d: err %v, same token as #0 %v", i, errs[i], got[i].AccessToken == got[0].AccessToken)
		}
	}
	h.remember(got[0].AccessToken.Reveal())
	if n := h.auth.Stats().TokenRefreshes; n != 1 {
		t.Errorf("token_refreshes = %d, want exactly 1", n)
	}
	if n := h.calls.Load(); n != 1 {
		t.Errorf("token endpoint requests = %d, want 1", n)
	}
	if code := h.validate(t, got[0].AccessToken); code != http.StatusOK {
		t.Errorf("accounts check = HTTP %d, want 200", code)
	}
}

func TestLoginRequired(t *testing.T) {
	tests := []struct {
		name      string
		cfg       simauth.Config
		setup     func(t *testing.T, h *rfHarness)
		wantCode  string
		wantReuse int64
	}{
		{
			name:      "refresh token reused",
			setup:     func(t *testing.T, h *rfHarness) { h.rotateBehindTheLock(t) },
			wantCode:  "refresh_token_reused",
			wantReuse: 1,
		},
		{
			name:     "refresh token expired",
			cfg:      simauth.Config{TokenTTL: time.Hour, RefreshTTL: time.Hour},
			setup:    func(t *testing.T, h *rfHarness) { h.clock.Set(90 * time.Minute) },
			wantCode: "refresh_token_expired",
		},
		{
			name:     "refresh token invalidated",
			setup:    func(t *testing.T, h *rfHarness) { h.auth.RevokeAll() },
			wantCode: "refresh_token_invalidated",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.cfg)
			s := h.source(t, nil)
			t1 := credOK(t, h, s)
			tt.setup(t, h)
			callsBefore := h.calls.Load()

			_, err := s.Rejected(t.Context(), t1.AccessToken)
			if !errors.Is(err, ErrLoginRequired) {
				t.Fatalf("Rejected = %v, want ErrLoginRequired", err)
			}
			h.checkNoSecret(t, err)
			for _, want := range []string{tt.wantCode, "codex login", h.path} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}

			// Never retried: further calls fail the same way without
			// presenting the dead refresh token again.
			for range 3 {
				if _, err := s.Rejected(t.Context(), t1.AccessToken); !errors.Is(err, ErrLoginRequired) {
					t.Errorf("Rejected again = %v, want ErrLoginRequired", err)
				}
			}
			h.clock.Set(3 * time.Hour)
			if _, err := s.Credential(t.Context()); !errors.Is(err, ErrLoginRequired) {
				t.Errorf("codexauth.Credential after expiry = %v, want ErrLoginRequired", err)
			}
			if n := h.calls.Load() - callsBefore; n != 1 {
				t.Errorf("token endpoint requests = %d, want 1 (never retried)", n)
			}
			if st := h.auth.Stats(); st.RefreshReuseDetected != tt.wantReuse {
				t.Errorf("refresh_reuse_detected = %d, want %d", st.RefreshReuseDetected, tt.wantReuse)
			}
			notices := h.noticeList()
			if len(notices) != 1 || !strings.Contains(notices[0], "codex login") || !strings.Contains(notices[0], tt.wantCode) {
				t.Errorf("notices = %q, want exactly one telling the user to run `codex login` (%s)", notices, tt.wantCode)
			}
		})
	}
}

func TestLoginRequiredClearsAfterSignIn(t *testing.T) {
	h := newHarness(t, simauth.Config{})
	s := h.source(t, nil)
	t1 := credOK(t, h, s)
	h.auth.RevokeAll()
	if _, err := s.Rejected(t.Context(), t1.AccessToken); !errors.Is(err, ErrLoginRequired) {
		t.Fatalf("Rejected = %v, want ErrLoginRequired", err)
	}
	// The user runs `codex login`: a new family lands in the file.
	if err := h.auth.WriteAuthFile(h.path, "acct-1"); err != nil {
		t.Fatal(err)
	}
	want := h.fileTokens(t)["access_token"]
	c := credOK(t, h, s)
	if c.AccessToken.Reveal() != want {
		t.Errorf("codexauth.Credential after a new sign-in did not return the file's new token")
	}
	if n := h.auth.Stats().TokenRefreshes; n != 0 {
		t.Errorf("token_refreshes = %d, want 0", n)
	}
	if code := h.validate(t, c.AccessToken); code != http.StatusOK {
		t.Errorf("accounts check = HTTP %d, want 200", code)
	}
}

func TestRefreshNever(t *testing.T) {
	h := newHarness(t, simauth.Config{})
	s := h.source(t, func(c *FileConfig) { c.Mode = RefreshNever })
	t1 := credOK(t, h, s)

	_, err := s.Rejected(t.Context(), t1.AccessToken)
	if !errors.Is(err, ErrRefreshDisabled) || !errors.Is(err, ErrTokenUnchanged) {
		t.Fatalf("Rejected with an unchanged file = %v, want ErrRefreshDisabled and ErrTokenUnchanged", err)
	}
	h.checkNoSecret(t, err)
	if _, err := s.Rejected(t.Context(), t1.AccessToken); !errors.Is(err, ErrRefreshDisabled) {
		t.Errorf("second Rejected = %v, want ErrRefreshDisabled", err)
	}
	notices := h.noticeList()
	if len(notices) != 1 || !strings.Contains(notices[0], "designated host") || !strings.Contains(notices[0], "--refresh=never") {
		t.Errorf("notices = %q, want one saying a designated host or the operator must refresh", notices)
	}

	// The designated host refreshes and the file is copied here.
	if err := h.auth.WriteAuthFile(h.path, "acct-1"); err != nil {
		t.Fatal(err)
	}
	t2, err := s.Rejected(t.Context(), t1.AccessToken)
	if err != nil {
		t.Fatalf("Rejected after the file changed: %v", err)
	}
	h.remember(t2.AccessToken.Reveal())
	if t2.AccessToken.Reveal() != h.fileTokens(t)["access_token"] {
		t.Errorf("Rejected did not return the file's new token")
	}

	// Expiry with nothing new in the file: an error, one more notice.
	h.clock.Set(2 * time.Hour)
	if _, err := s.Credential(t.Context()); !errors.Is(err, ErrRefreshDisabled) {
		t.Errorf("codexauth.Credential after expiry = %v, want ErrRefreshDisabled", err)
	}
	if _, err := s.Credential(t.Context()); !errors.Is(err, ErrRefreshDisabled) {
		t.Errorf("codexauth.Credential after expiry, again = %v, want ErrRefreshDisabled", err)
	}
	if n := len(h.noticeList()); n != 2 {
		t.Errorf("notices = %d, want 2 (one per incident)", n)
	}
	if err := h.auth.WriteAuthFile(h.path, "acct-1"); err != nil {
		t.Fatal(err)
	}
	h.clock.Set(2*time.Hour + 2*time.Second) // past the re-read throttle
	c := credOK(t, h, s)
	if code := h.validate(t, c.AccessToken); code != http.StatusOK {
		t.Errorf("accounts check with the re-read token = HTTP %d, want 200", code)
	}
	if st := h.auth.Stats(); st.TokenRefreshes != 0 || h.calls.Load() != 0 {
		t.Errorf("token_refreshes = %d, endpoint requests = %d; want 0 and 0 in RefreshNever mode", st.TokenRefreshes, h.calls.Load())
	}
}

func TestWriteBackKeepsTheFileAndIsAtomic(t *testing.T) {
	h := newHarness(t, simauth.Config{})
	tok := h.fileTokens(t)
	// A file as Codex CLI might have it, with members clodex does not know.
	doc := fmt.Sprintf(`{
  "auth_mode": "chatgpt",
  "OPENAI_API_KEY": null,
  "tokens": {
    "id_token": %q,
    "access_token": %q,
    "refresh_token": %q,
    "account_id": "acct-stored",
    "future_token_field": {"a": [1, 2.50, "x"]}
  },
  "last_refresh": "2026-11-01T00:00:00Z",
  "zz_future_top": 12345678901234567890
}`, tok["id_token"], tok["access_token"], tok["refresh_token"])
	if err := os.WriteFile(h.path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(h.path, 0o644); err != nil {
		t.Fatal(err)
	}
	s := h.source(t, nil)
	h.clock.Set(30 * time.Minute)
	c, err := s.Rejected(t.Context(), codexauth.Secret(tok["access_token"]))
	if err != nil {
		t.Fatalf("Rejected: %v", err)
	}
	h.remember(c.AccessToken.Reveal())

	fi, err := os.Stat(h.path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Errorf("auth.json mode = %o, want 600", mode)
	}
	entries, err := os.ReadDir(filepath.Dir(h.path))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	if want := []string{"auth.json", "auth.json.lock"}; strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("directory holds %q, want %q (no temporary files left)", names, want)
	}
	if fi, err := os.Stat(h.path + ".lock"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("lock file: %v, mode %v; want mode 600", err, fi.Mode().Perm())
	}

	data, err := os.ReadFile(h.path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	var got struct {
		AuthMode    string  `json:"auth_mode"`
		APIKey      *string `json:"OPENAI_API_KEY"`
		LastRefresh string  `json:"last_refresh"`
		Future      json.Number
		Tokens      struct {
			ID, Access, Refresh, Account string
			FutureField                  json.RawMessage
		}
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var raw map[string]json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		t.Fatalf("written file is not JSON: %v", err)
	}
	_ = json.Unmarshal(raw["auth_mode"], &got.AuthMode)
	_ = json.Unmarshal(raw["OPENAI_API_KEY"], &got.APIKey)
	_ = json.Unmarshal(raw["last_refresh"], &got.LastRefresh)
	var toks map[string]json.RawMessage
	_ = json.Unmarshal(raw["tokens"], &toks)
	str := func(m json.RawMessage) string { var s string; _ = json.Unmarshal(m, &s); return s }

	if got.AuthMode != "chatgpt" || got.APIKey != nil {
		t.Errorf("auth_mode = %q, OPENAI_API_KEY = %v; want chatgpt, null", got.AuthMode, got.APIKey)
	}
	if string(raw["zz_future_top"]) != "12345678901234567890" {
		t.Errorf("zz_future_top = %s, want 12345678901234567890 unchanged", raw["zz_future_top"])
	}
	var compact bytes.Buffer
	_ = json.Compact(&compact, toks["future_token_field"])
	if compact.String() != `{"a":[1,2.50,"x"]}` {
		t.Errorf("tokens.future_token_field = %s, want it kept", toks["future_token_field"])
	}
	if str(toks["account_id"]) != "acct-stored" {
		t.Errorf("tokens.account_id = %q, want acct-stored", str(toks["account_id"]))
	}
	if str(toks["access_token"]) != c.AccessToken.Reveal() {
		t.Errorf("tokens.access_token is not the refreshed token")
	}
	if rt := str(toks["refresh_token"]); rt == "" || rt == tok["refresh_token"] {
		t.Errorf("tokens.refresh_token was not replaced by the rotated token")
	}
	if id := str(toks["id_token"]); id == "" || id == tok["id_token"] {
		t.Errorf("tokens.id_token was not replaced by the new id token")
	}
	if want := rfStart.Add(30 * time.Minute).Format(time.RFC3339); got.LastRefresh != want {
		t.Errorf("last_refresh = %q, want %q", got.LastRefresh, want)
	}
	// Codex CLI's member order is kept.
	order := []string{`"auth_mode"`, `"OPENAI_API_KEY"`, `"tokens"`, `"id_token"`, `"access_token"`, `"refresh_token"`, `"account_id"`, `"future_token_field"`, `"last_refresh"`, `"zz_future_top"`}
	last := -1
	for _, k := range order {
		i := strings.Index(text, k)
		if i < last {
			t.Errorf("member %s moved: order not kept in\n%s", k, "(file contents withheld: they hold tokens)")
		}
		last = i
	}
}

// cannedEndpoint answers every token request with status and body, and
// records the forms it received.
func cannedEndpoint(t *testing.T, status int, body string) (*httptest.Server, *[]map[string][]string) {
	t.Helper()
	var mu sync.Mutex
	var forms []map[string][]string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		mu.Lock()
		forms = append(forms, r.PostForm)
		mu.Unlock()
		if r.Header.Get("Accept") != "application/json" || r.Header.Get("Content-Type") != "application/x-www-form-urlencoded" {
			http.Error(w, "bad headers", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, &forms
}

// rfJWT builds an unsigned JWT whose signature segment is marker.
func rfJWT(t *testing.T, claims map[string]any, marker string) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc(payload) + "." + marker
}

// TestWriteBackThroughSymlink: an auth.json that is a symlink (a dotfiles
// repository, a mounted secret) stays a link; the file it points to gets
// the rotated tokens, mode 0600.
func TestWriteBackThroughSymlink(t *testing.T) {
	h := newHarness(t, simauth.Config{})
	target := filepath.Join(t.TempDir(), "real-auth.json")
	if err := os.Rename(h.path, target); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(target, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, h.path); err != nil {
		t.Fatalf("symlink: %v", err)
	}
	old := h.fileTokens(t)
	s := h.source(t, nil)
	h.clock.Set(30 * time.Minute)
	c, err := s.Rejected(t.Context(), codexauth.Secret(old["access_token"]))
	if err != nil {
		t.Fatalf("Rejected: %v", err)
	}
	h.remember(c.AccessToken.Reveal())

	if fi, err := os.Lstat(h.path); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("auth.json is no longer a symlink (%v)", err)
	}
	if got := h.fileTokens(t)["access_token"]; got != c.AccessToken.Reveal() || got == old["access_token"] {
		t.Errorf("the linked file does not hold the refreshed access token")
	}
	if fi, err := os.Stat(target); err != nil {
		t.Error(err)
	} else if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Errorf("linked file mode = %o, want 600", mode)
	}
}

func TestRefreshAnswers(t *testing.T) {
	const marker = "LEAKED-TOKEN-MARKER"
	oldAccess := rfJWT(t, map[string]any{"chatgpt_account_id": "acct-old", "iat": rfStart.Unix(), "exp": rfStart.Add(time.Hour).Unix()}, marker+"-old")
	newAccess := rfJWT(t, map[string]any{"chatgpt_account_id": "acct-new", "iat": rfStart.Unix(), "exp": rfStart.Add(time.Hour).Unix()}, marker+"-new")
	tests := []struct {
		name        string
		status      int
		body        string
		wantLogin   bool
		wantErr     string // substring; empty: success
		wantRefresh string // refresh_token in the file afterwards
	}{
		{"error object code", 401, `{"error":{"message":"x","type":"invalid_request_error","code":"refresh_token_reused"}}`, true, "refresh_token_reused", "rt-old-" + marker},
		{"error string", 400, `{"error":"invalid_grant","error_description":"bad"}`, true, "invalid_grant", "rt-old-" + marker},
		{"top-level code", 401, `{"code":"refresh_token_expired"}`, true, "refresh_token_expired", "rt-old-" + marker},
		{"bare 401", 401, `nope`, true, "HTTP 401", "rt-old-" + marker},
		{"other 400", 400, `{"error":{"code":"invalid_request"}}`, false, "HTTP 400 (invalid_request)", "rt-old-" + marker},
		{"server error", 503, `upstream down`, false, "HTTP 503", "rt-old-" + marker},
		{"no access token", 200, `{"access_token":""}`, false, "no access_token", "rt-old-" + marker},
		{"not json", 200, `<html>`, false, "not the expected JSON", "rt-old-" + marker},
		{"same token again", 200, `{"access_token":"` + oldAccess + `","refresh_token":"rt-2-` + marker + `"}`, false, "rejected access token is still", "rt-2-" + marker},
		{"no refresh token returned keeps the old", 200, `{"access_token":"` + newAccess + `","expires_in":3600}`, false, "", "rt-old-" + marker},
		{"rotated", 200, `{"access_token":"` + newAccess + `","refresh_token":"rt-2-` + marker + `","id_token":"` + newAccess + `"}`, false, "", "rt-2-" + marker},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, forms := cannedEndpoint(t, tt.status, tt.body)
			path := filepath.Join(t.TempDir(), "auth.json")
			doc := `{"auth_mode":"chatgpt","tokens":{"access_token":"` + oldAccess + `","refresh_token":"rt-old-` + marker + `"}}`
			if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
				t.Fatal(err)
			}
			logs := &syncBuffer{}
			var notices []string
			s, err := NewFileSource(FileConfig{
				Path: path, TokenEndpoint: srv.URL + "/oauth/token", ClientID: "client-x",
				Clock: func() time.Time { return rfStart }, Logger: slogJSON(logs),
				Notify: func(m string) { notices = append(notices, m) },
			})
			if err != nil {
				t.Fatalf("NewFileSource: %v", err)
			}
			c, err := s.Rejected(t.Context(), codexauth.Secret(oldAccess))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Rejected: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Rejected = %v, want an error mentioning %q", err, tt.wantErr)
			}
			if got := errors.Is(err, ErrLoginRequired); got != tt.wantLogin {
				t.Errorf("errors.Is(err, ErrLoginRequired) = %v, want %v", got, tt.wantLogin)
			}
			if tt.wantLogin != (len(notices) == 1) {
				t.Errorf("notices = %q, want %d", notices, map[bool]int{true: 1}[tt.wantLogin])
			}
			if err == nil && (c.AccessToken.Reveal() != newAccess || c.AccountID != "acct-new") {
				t.Errorf("Rejected = account %q, new token %v; want acct-new, true", c.AccountID, c.AccessToken.Reveal() == newAccess)
			}
			if len(*forms) != 1 {
				t.Fatalf("token requests = %d, want 1", len(*forms))
			}
			f := (*forms)[0]
			if f["grant_type"][0] != "refresh_token" || f["refresh_token"][0] != "rt-old-"+marker || f["client_id"][0] != "client-x" {
				t.Errorf("form = grant_type %q client_id %q right refresh token %v", f["grant_type"], f["client_id"], f["refresh_token"][0] == "rt-old-"+marker)
			}
			data, _ := os.ReadFile(path)
			var file struct{ Tokens map[string]string }
			_ = json.Unmarshal(data, &file)
			if file.Tokens["refresh_token"] != tt.wantRefresh {
				t.Errorf("file refresh_token ends %q, want %q", tail(file.Tokens["refresh_token"]), tail(tt.wantRefresh))
			}
			for _, out := range append(notices, logs.String(), fmt.Sprint(err)) {
				if strings.Contains(out, marker) {
					t.Errorf("a token leaked: %q", out)
				}
			}
		})
	}
}

func tail(s string) string {
	if i := strings.LastIndex(s, "-"); i > 0 {
		return s[:i] // without the marker
	}
	return s
}

func TestTransientFailureKeepsValidToken(t *testing.T) {
	h := newHarness(t, simauth.Config{})
	s := h.source(t, nil)
	t1 := credOK(t, h, s)
	h.failing.Store(http.StatusServiceUnavailable)

	h.clock.Set(time.Hour - time.Minute) // within the skew, still valid
	c := credOK(t, h, s)
	if c.AccessToken != t1.AccessToken {
		t.Errorf("codexauth.Credential during an outage did not keep the valid token")
	}
	if !strings.Contains(h.logs.String(), "token refresh failed") {
		t.Errorf("the failed refresh was not logged")
	}

	h.clock.Set(time.Hour + time.Second) // expired
	_, err := s.Credential(t.Context())
	if err == nil || errors.Is(err, ErrLoginRequired) || !strings.Contains(err.Error(), "HTTP 503") {
		t.Errorf("codexauth.Credential with an expired token during an outage = %v, want an HTTP 503 error that is not ErrLoginRequired", err)
	}
	h.checkNoSecret(t, err)
	if _, err := s.Rejected(t.Context(), t1.AccessToken); err == nil {
		t.Errorf("Rejected during an outage = nil error, want one")
	}

	h.failing.Store(0)
	c2 := credOK(t, h, s)
	if c2.AccessToken == t1.AccessToken || h.validate(t, c2.AccessToken) != http.StatusOK {
		t.Errorf("codexauth.Credential after the outage did not refresh to a valid token")
	}
	if st := h.auth.Stats(); st.TokenRefreshes != 1 || st.RefreshReuseDetected != 0 {
		t.Errorf("stats = %+v, want 1 refresh, no reuse", st)
	}
}

func TestNewFileSourceErrors(t *testing.T) {
	good := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(good, []byte(`{"auth_mode":"chatgpt","tokens":{"access_token":"a","refresh_token":"r"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  FileConfig
		want []string
	}{
		{"empty path", FileConfig{}, []string{"field Path is empty"}},
		{"bad endpoint", FileConfig{Path: good, TokenEndpoint: "ftp://x/token"}, []string{`field TokenEndpoint "ftp://x/token" is invalid`}},
		{"relative endpoint", FileConfig{Path: good, TokenEndpoint: "/oauth/token"}, []string{"want an http or https URL"}},
		{"bad mode", FileConfig{Path: good, Mode: 7}, []string{"field Mode RefreshMode(7) is invalid; choices are auto, never"}},
		{"negative durations", FileConfig{Path: good, Skew: -time.Second, LockWait: -1}, []string{"field Skew -1s is invalid", "field LockWait -1ns is invalid"}},
		{"all at once", FileConfig{TokenEndpoint: "x", Mode: 2}, []string{"Path is empty", "TokenEndpoint", "Mode"}},
		{"missing file", FileConfig{Path: good + ".missing"}, []string{good + ".missing does not exist", "codex login"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewFileSource(tt.cfg)
			if err == nil {
				t.Fatal("NewFileSource: no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("NewFileSource error = %q, want it to mention %q", err, w)
				}
			}
		})
	}
}

func TestParseRefreshMode(t *testing.T) {
	tests := []struct {
		in      string
		want    RefreshMode
		wantErr bool
	}{
		{"auto", RefreshAuto, false},
		{"never", RefreshNever, false},
		{" Never ", RefreshNever, false},
		{"", 0, true},
		{"sometimes", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseRefreshMode(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseRefreshMode(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "choices are auto, never") {
			t.Errorf("ParseRefreshMode(%q) error = %q, want it to list the choices", tt.in, err)
		}
	}
	if RefreshAuto.String() != "auto" || RefreshNever.String() != "never" {
		t.Errorf("String() = %q, %q; want auto, never", RefreshAuto, RefreshNever)
	}
}

func TestRejectedTokenIsNotHandedOutAgain(t *testing.T) {
	h := newHarness(t, simauth.Config{})
	s := h.source(t, nil)
	t1 := credOK(t, h, s)
	h.failing.Store(http.StatusBadGateway)
	if _, err := s.Rejected(t.Context(), t1.AccessToken); err == nil || !strings.Contains(err.Error(), "HTTP 502") {
		t.Fatalf("Rejected during an outage = %v, want an HTTP 502 error", err)
	}
	// The token is still unexpired, but upstream refused it: Credential
	// must not return it.
	if c, err := s.Credential(t.Context()); err == nil {
		t.Errorf("codexauth.Credential after a failed Rejected returned a token (the rejected one: %v), want an error", c.AccessToken == t1.AccessToken)
	}
	h.failing.Store(0)
	c := credOK(t, h, s)
	if c.AccessToken == t1.AccessToken || h.validate(t, c.AccessToken) != http.StatusOK {
		t.Errorf("codexauth.Credential after the outage did not replace the rejected token")
	}
}

func TestLockHeldByAnotherProcess(t *testing.T) {
	h := newHarness(t, simauth.Config{})
	s := h.source(t, func(c *FileConfig) { c.LockWait = 50 * time.Millisecond })
	t1 := credOK(t, h, s)
	held, err := filelock.Acquire(t.Context(), h.path+".lock")
	if err != nil {
		t.Fatalf("filelock.Acquire: %v", err)
	}
	_, err = s.Rejected(t.Context(), t1.AccessToken)
	if err == nil || !strings.Contains(err.Error(), "another process has held it") {
		t.Errorf("Rejected while the lock is held = %v, want a lock-wait error", err)
	}
	// Ahead of expiry a held lock only delays the refresh.
	h.clock.Set(time.Hour - time.Minute)
	s2 := h.source(t, func(c *FileConfig) { c.LockWait = 50 * time.Millisecond })
	if c := credOK(t, h, s2); c.AccessToken != t1.AccessToken {
		t.Errorf("codexauth.Credential with the lock held did not keep the still-valid token")
	}
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	if n := h.calls.Load(); n != 0 {
		t.Errorf("token endpoint requests while the lock was held = %d, want 0", n)
	}
	c := credOK(t, h, s2)
	if c.AccessToken == t1.AccessToken {
		t.Errorf("codexauth.Credential after the lock was released did not refresh")
	}
}
