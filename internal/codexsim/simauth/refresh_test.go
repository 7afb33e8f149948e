package simauth

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRefreshRotation(t *testing.T) {
	e := newEnv(t, Config{})
	first, err := e.a.Issue("acct-rot")
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}

	seen := map[string]bool{first.RefreshToken: true}
	rt := first.RefreshToken
	for i := range 3 {
		r := e.refresh(t, rt)
		if r.status != http.StatusOK {
			t.Fatalf("refresh %d: status %d, want 200; body %s", i, r.status, r.raw)
		}
		next := str(t, r.body, "refresh_token")
		if seen[next] {
			t.Fatalf("refresh %d returned a refresh token seen before; want a new one each time", i)
		}
		seen[next] = true
		if got := str(t, r.body, "token_type"); got != "Bearer" {
			t.Errorf("token_type = %q, want Bearer", got)
		}
		if got, _ := r.body["expires_in"].(float64); got != 3600 {
			t.Errorf("expires_in = %v, want 3600", r.body["expires_in"])
		}
		acct, err := e.a.Validate(str(t, r.body, "access_token"))
		if err != nil || acct != "acct-rot" {
			t.Fatalf("Validate(new access token) = %q, %v; want acct-rot, nil", acct, err)
		}
		if str(t, r.body, "id_token") == "" {
			t.Fatal("id_token is empty")
		}
		rt = next
	}
	if got, want := e.a.Stats(), (Stats{TokenRefreshes: 3}); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}

	// The first token was rotated: presenting it again is reuse.
	r := e.refresh(t, first.RefreshToken)
	if r.status != http.StatusUnauthorized {
		t.Fatalf("reusing the first refresh token: status %d, want 401; body %s", r.status, r.raw)
	}
	if got := codexRefreshErrorCode(r.raw); got != "refresh_token_reused" {
		t.Errorf("Codex-parsed error code = %q, want refresh_token_reused; body %s", got, r.raw)
	}
}

func TestRefreshAcceptsJSONBody(t *testing.T) {
	// Codex CLI sends the refresh request as JSON.
	e := newEnv(t, Config{})
	tok, err := e.a.Issue("acct-json")
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	r := e.postJSON(t, "/oauth/token", map[string]string{
		"client_id":     "app_EMoamEEZ73f0CkXaXp7hrann",
		"grant_type":    "refresh_token",
		"refresh_token": tok.RefreshToken,
		"scope":         "openid profile email",
	})
	if r.status != http.StatusOK {
		t.Fatalf("status %d, want 200; body %s", r.status, r.raw)
	}
	if acct, err := e.a.Validate(str(t, r.body, "access_token")); err != nil || acct != "acct-json" {
		t.Errorf("Validate = %q, %v; want acct-json, nil", acct, err)
	}
}

func TestRefreshReuseRevokesFamily(t *testing.T) {
	e := newEnv(t, Config{})
	t0, err := e.a.Issue("acct-fam")
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	other, err := e.a.Issue("acct-other")
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	r1 := e.refresh(t, t0.RefreshToken)
	if r1.status != http.StatusOK {
		t.Fatalf("refresh t0: status %d; body %s", r1.status, r1.raw)
	}
	r2 := e.refresh(t, str(t, r1.body, "refresh_token"))
	if r2.status != http.StatusOK {
		t.Fatalf("refresh t1: status %d; body %s", r2.status, r2.raw)
	}
	newest := str(t, r2.body, "refresh_token")

	reuse := e.refresh(t, t0.RefreshToken)
	if reuse.status != http.StatusUnauthorized {
		t.Fatalf("reuse: status %d, want 401; body %s", reuse.status, reuse.raw)
	}
	// The real auth.openai.com envelope, as Codex CLI logs it.
	want := `{"error":{"message":"Your refresh token has already been used to generate a new access token. Please try signing in again.","type":"invalid_request_error","param":null,"code":"refresh_token_reused"}}`
	if got := strings.TrimSpace(reuse.raw); got != want {
		t.Errorf("reuse body =\n%s\nwant\n%s", got, want)
	}

	// The family's newest token is revoked too.
	r := e.refresh(t, newest)
	if r.status != http.StatusUnauthorized || codexRefreshErrorCode(r.raw) != "refresh_token_invalidated" {
		t.Errorf("newest token after reuse: status %d code %q, want 401 refresh_token_invalidated; body %s",
			r.status, codexRefreshErrorCode(r.raw), r.raw)
	}
	// Another family is untouched.
	if r := e.refresh(t, other.RefreshToken); r.status != http.StatusOK {
		t.Errorf("other family: status %d, want 200; body %s", r.status, r.raw)
	}
	// A second reuse is counted again.
	if r := e.refresh(t, t0.RefreshToken); codexRefreshErrorCode(r.raw) != "refresh_token_reused" {
		t.Errorf("second reuse: code %q, want refresh_token_reused", codexRefreshErrorCode(r.raw))
	}
	if got, want := e.a.Stats(), (Stats{TokenRefreshes: 3, RefreshReuseDetected: 2}); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
	b, err := json.Marshal(e.a.Stats())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"token_refreshes":3,"refresh_reuse_detected":2}`; got != want {
		t.Errorf("Stats JSON = %s, want %s", got, want)
	}
}

func TestRefreshFailures(t *testing.T) {
	tests := []struct {
		name string
		// setup returns the refresh token to present.
		setup    func(t *testing.T, e *testEnv) string
		wantCode string
	}{
		{
			name:     "unknown token",
			setup:    func(*testing.T, *testEnv) string { return "rt_never-issued" },
			wantCode: "refresh_token_invalidated",
		},
		{
			name: "expired after RefreshTTL",
			setup: func(t *testing.T, e *testEnv) string {
				tok := issue(t, e.a, "acct-x")
				e.clock.Advance(2 * time.Hour)
				return tok.RefreshToken
			},
			wantCode: "refresh_token_expired",
		},
		{
			name: "revoked by RevokeAll",
			setup: func(t *testing.T, e *testEnv) string {
				tok := issue(t, e.a, "acct-x")
				e.a.RevokeAll()
				return tok.RefreshToken
			},
			wantCode: "refresh_token_invalidated",
		},
		{
			name: "shortened by SetRefreshTTL",
			setup: func(t *testing.T, e *testEnv) string {
				e.a.SetRefreshTTL(time.Minute)
				tok := issue(t, e.a, "acct-x")
				e.clock.Advance(time.Minute)
				return tok.RefreshToken
			},
			wantCode: "refresh_token_expired",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, Config{RefreshTTL: 2 * time.Hour})
			r := e.refresh(t, tt.setup(t, e))
			if r.status != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401; body %s", r.status, r.raw)
			}
			if got := codexRefreshErrorCode(r.raw); got != tt.wantCode {
				t.Errorf("code = %q, want %q; body %s", got, tt.wantCode, r.raw)
			}
			if got := e.a.Stats(); got != (Stats{}) {
				t.Errorf("Stats() = %+v, want zero", got)
			}
		})
	}
}

func TestRefreshTokenValidUntilTTL(t *testing.T) {
	e := newEnv(t, Config{RefreshTTL: 2 * time.Hour})
	tok := issue(t, e.a, "acct-x")
	e.clock.Advance(2*time.Hour - time.Second)
	if r := e.refresh(t, tok.RefreshToken); r.status != http.StatusOK {
		t.Fatalf("1s before expiry: status %d, want 200; body %s", r.status, r.raw)
	}
}

func TestRevokeAllKeepsReuseDetection(t *testing.T) {
	e := newEnv(t, Config{})
	tok := issue(t, e.a, "acct-x")
	if r := e.refresh(t, tok.RefreshToken); r.status != http.StatusOK {
		t.Fatalf("refresh: status %d", r.status)
	}
	e.a.RevokeAll()
	if got := codexRefreshErrorCode(e.refresh(t, tok.RefreshToken).raw); got != "refresh_token_reused" {
		t.Errorf("rotated token after RevokeAll: code %q, want refresh_token_reused", got)
	}
}

// TestConcurrentRefreshSameToken races several refreshes of one token: one
// wins, every other is reuse, and the family (winner included) is revoked.
func TestConcurrentRefreshSameToken(t *testing.T) {
	e := newEnv(t, Config{})
	tok := issue(t, e.a, "acct-race")
	const n = 8
	type result struct {
		status int
		body   string
		err    error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}, "client_id": {ClientID}}
			resp, err := e.srv.Client().PostForm(e.srv.URL+"/oauth/token", form)
			if err != nil {
				results[i].err = err
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			results[i] = result{resp.StatusCode, string(b), err}
		})
	}
	wg.Wait()
	var winners, reused int
	var winnerRT string
	for i, r := range results {
		switch {
		case r.err != nil:
			t.Fatalf("request %d: %v", i, r.err)
		case r.status == http.StatusOK:
			winners++
			var m map[string]any
			if err := json.Unmarshal([]byte(r.body), &m); err != nil {
				t.Fatal(err)
			}
			winnerRT = str(t, m, "refresh_token")
		case codexRefreshErrorCode(r.body) == "refresh_token_reused":
			reused++
		default:
			t.Errorf("request %d: status %d body %s", i, r.status, r.body)
		}
	}
	if winners != 1 || reused != n-1 {
		t.Fatalf("winners = %d, reused = %d; want 1 and %d", winners, reused, n-1)
	}
	if got := codexRefreshErrorCode(e.refresh(t, winnerRT).raw); got != "refresh_token_invalidated" {
		t.Errorf("winner's token after reuse: code %q, want refresh_token_invalidated", got)
	}
	if got, want := e.a.Stats(), (Stats{TokenRefreshes: 1, RefreshReuseDetected: n - 1}); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
}

func TestIssueRejectsBadAccountID(t *testing.T) {
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"", "has space", "-lead", strings.Repeat("a", 129), "a/b", "é"} {
		if _, err := a.Issue(id); err == nil {
			t.Errorf("Issue(%q) = nil error, want an error", id)
		} else if !strings.Contains(err.Error(), "want 1-128 characters") {
			t.Errorf("Issue(%q) error %q does not say what is allowed", id, err)
		}
	}
}

func TestPruneKeepsLiveTokens(t *testing.T) {
	e := newEnv(t, Config{RefreshTTL: time.Minute})
	old := issue(t, e.a, "acct-old")
	e.clock.Advance(2 * time.Minute)
	var live Tokens
	for range minPrune + 10 {
		live = issue(t, e.a, "acct-live")
	}
	e.a.mu.Lock()
	n := len(e.a.refresh)
	e.a.mu.Unlock()
	if n > minPrune+10 {
		t.Errorf("refresh table has %d entries after pruning, want at most %d", n, minPrune+10)
	}
	if r := e.refresh(t, live.RefreshToken); r.status != http.StatusOK {
		t.Errorf("live token after prune: status %d", r.status)
	}
	if r := e.refresh(t, old.RefreshToken); r.status != http.StatusUnauthorized {
		t.Errorf("pruned expired token: status %d, want 401", r.status)
	}
}

func issue(t *testing.T, a *Authority, acct string) Tokens {
	t.Helper()
	tok, err := a.Issue(acct)
	if err != nil {
		t.Fatalf("Issue(%q): %v", acct, err)
	}
	return tok
}
