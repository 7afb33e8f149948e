package codexsim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/internal/codexsim/simauth"
)

func TestFaults(t *testing.T) {
	t.Run("close after N events", func(t *testing.T) {
		_, ts := testServer(t, Config{Faults: Faults{CloseAfterEvents: 3}})
		c := mustDial(t, ts)
		send(t, c, create("#sim reply a b c d e f", nil))
		for i := range 3 {
			readEvent(t, c)
			_ = i
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, _, err := c.Read(ctx)
		if err == nil {
			t.Fatal("read a 4th event, want the socket dropped after 3")
		}
		if got := closeStatus(err); got != -1 {
			t.Errorf("close status %v, want an abrupt drop without a close frame", got)
		}
	})
	t.Run("upgrade 5xx share", func(t *testing.T) {
		srv, ts := testServer(t, Config{Faults: Faults{Upgrade5xxShare: 0.5, Upgrade5xxStatus: 502}})
		var got []int
		for range 4 {
			c, status, _ := dial(t.Context(), ts, ChatGPTPath, goodHeaders(testToken, testAccount))
			if c != nil {
				_ = c.CloseNow()
			}
			got = append(got, status)
		}
		if want := []int{101, 502, 101, 502}; !equalInts(got, want) {
			t.Errorf("statuses = %v, want %v", got, want)
		}
		if st := srv.Stats(); st.Upgrade5xxs != 2 || st.Upgrade403s != 0 || st.Upgrades != 2 {
			t.Errorf("stats upgrade_5xxs=%d upgrade_403s=%d upgrades=%d, want 2, 0, 2", st.Upgrade5xxs, st.Upgrade403s, st.Upgrades)
		}
	})
	t.Run("stall", func(t *testing.T) {
		srv, ts := testServer(t, Config{})
		if err := srv.SetConfig(ConfigPatch{Stall: ptr(true)}); err != nil {
			t.Fatal(err)
		}
		c := mustDial(t, ts)
		send(t, c, create("#sim reply never", nil))
		readEvent(t, c)
		if e := readEvent(t, c); e["type"] != "response.created" {
			t.Fatalf("event %v, want response.created", e["type"])
		}
		send(t, c, create("#sim reply x", nil))
		if code := errorOf(t, readEvent(t, c))["code"]; code != "response_in_progress" {
			t.Errorf("code %v, want response_in_progress", code)
		}
	})
	t.Run("delays", func(t *testing.T) {
		_, ts := testServer(t, Config{DeltaInterval: time.Millisecond, Faults: Faults{FirstByteDelay: 20 * time.Millisecond, InterEventDelay: time.Millisecond}})
		c := mustDial(t, ts)
		start := time.Now()
		send(t, c, create("#sim reply one two three", nil))
		evs := readResponse(t, c)
		// 20ms first byte + at least 1ms between each of the other events.
		if el, min := time.Since(start), 20*time.Millisecond+time.Duration(len(evs)-1)*time.Millisecond; el < min {
			t.Errorf("response took %v, want at least %v", el, min)
		}
	})
	t.Run("expired token", func(t *testing.T) {
		clock := newFakeClock()
		auth, err := simauth.New(simauth.Config{TokenTTL: time.Minute, Clock: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		srv, ts := testServer(t, Config{Auth: auth, Clock: clock.Now})
		tok, err := auth.Issue("acct-oauth")
		if err != nil {
			t.Fatal(err)
		}
		c, status, err := dial(t.Context(), ts, ChatGPTPath, goodHeaders(tok.AccessToken, "acct-oauth"))
		if err != nil {
			t.Fatalf("dial with an issued token: status %d: %v", status, err)
		}
		_ = c.CloseNow()
		clock.Advance(time.Minute + time.Second)
		_, status, _ = dial(t.Context(), ts, ChatGPTPath, goodHeaders(tok.AccessToken, "acct-oauth"))
		if status != 401 {
			t.Errorf("expired token: status %d, want 401", status)
		}
		if st := srv.Stats(); st.Upgrade401s != 1 || st.Upgrades != 1 {
			t.Errorf("stats upgrade_401s=%d upgrades=%d, want 1 and 1", st.Upgrade401s, st.Upgrades)
		}
	})
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func ptr[T any](v T) *T { return &v }

func TestSimEndpoints(t *testing.T) {
	auth, err := simauth.New(simauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, ts := testServer(t, Config{Auth: auth})
	post := func(path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "POST", ts.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	get := func(path string) map[string]any {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "GET", ts.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return m
	}

	stats := get(StatsPath)
	for _, k := range []string{"upgrades", "upgrade_403s", "max_upgrades_per_window", "open_sockets", "responses", "prewarms",
		"continued_responses", "input_tokens", "cached_tokens", "token_refreshes", "refresh_reuse_detected", "errors",
		"upgrades_by_account", "previous_response_not_found", "usage_by_account"} {
		if _, ok := stats[k]; !ok {
			t.Errorf("/sim/stats has no %q", k)
		}
	}
	if _, ok := stats["max_upgrades_per_window"].(map[string]any); !ok {
		t.Errorf("max_upgrades_per_window = %v, want an object", stats["max_upgrades_per_window"])
	}

	// Every refusal names the key and what it takes, never a Go type.
	badPatches := []struct{ body, want string }{
		{`{"upgrade_limitt":3}`, `unknown key \"upgrade_limitt\"; allowed: accept_tokens, close_after_events,`},
		{`{"faults":{"stall":true}}`, `unknown key \"faults\"; allowed:`},
		{`{"upgrade_window":"soon"}`, `upgrade_window: want a duration such as \"10s\", got \"soon\"`},
		{`{"stall":"yes"}`, `stall: want true or false, got \"yes\"`},
		{`{"accept_tokens":3}`, `accept_tokens: want an object of token to account id`},
		{`{"upgrade_limit":-1}`, "upgrade_limit -1 is invalid; want 1 or more"},
		{`{"upgrade_5xx_share":2}`, "upgrade_5xx_share 2 is invalid; want a number in [0, 1]"},
		{`{"token_ttl":"1ms"}`, "token_ttl 1ms is invalid; want at least 1s"},
		{`{"oauth":false}`, "oauth is read-only"},
		{`{"accepted_tokens":2,"stall":1}`, "accepted_tokens is read-only"},
		{`not json`, "the body is not one JSON object of settings"},
	}
	for _, bp := range badPatches {
		status, body := post(ConfigPath, bp.body)
		if status != 400 || !strings.Contains(body, bp.want) || strings.Contains(body, "Go ") || strings.Contains(body, "ConfigPatch") {
			t.Errorf("POST %s: %d %s; want 400 naming %q and no Go type", bp.body, status, body, bp.want)
		}
	}
	status, body := post(ConfigPath, `{"upgrade_limit":3,"upgrade_window":"10s","delta_interval":"5ms","close_after_events":7,"token_ttl":"30s","accept_tokens":{"tok-new":"acct-new"}}`)
	if status != 200 {
		t.Fatalf("good patch: %d %s", status, body)
	}
	cfg := get(ConfigPath)
	if cfg["upgrade_limit"] != 3.0 || cfg["upgrade_window"] != "10s" || cfg["delta_interval"] != "5ms" ||
		cfg["close_after_events"] != 7.0 || cfg["accepted_tokens"] != 2.0 || cfg["token_ttl"] != "30s" {
		t.Errorf("config after patch = %v; want the patched values, token_ttl 30s and 2 accepted tokens", cfg)
	}
	// One shape: what GET shows, POST takes (but the read-only facts).
	for k := range readOnlyKeys {
		delete(cfg, k)
	}
	back, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := post(ConfigPath, string(back)); status != 200 {
		t.Errorf("POST of GET's own keys %s: %d %s; want 200", back, status, body)
	}
	if strings.Contains(body, "tok-new") || strings.Contains(body, testToken) {
		t.Errorf("config view leaks a token: %s", body)
	}
	c, st, err := dial(t.Context(), ts, ChatGPTPath, goodHeaders("tok-new", "acct-new"))
	if err != nil {
		t.Fatalf("dial with a token added at run time: %d %v", st, err)
	}
	_ = c.CloseNow()

	// The OAuth emulator's endpoints are mounted; a refresh counts in stats.
	tok, err := auth.Issue("acct-oauth")
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}, "client_id": {simauth.ClientID}}
	req, _ := http.NewRequestWithContext(t.Context(), "POST", ts.URL+"/oauth/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var refreshed struct {
		AccessToken string `json:"access_token"`
	}
	err = json.NewDecoder(resp.Body).Decode(&refreshed)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || refreshed.AccessToken == "" {
		t.Fatalf("POST /oauth/token: %d (%v)", resp.StatusCode, err)
	}
	// Reusing the rotated refresh token is detected.
	req, _ = http.NewRequestWithContext(t.Context(), "POST", ts.URL+"/oauth/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || !bytes.Contains(b, []byte("refresh_token_reused")) {
		t.Errorf("reused refresh token: %d %s", resp.StatusCode, b)
	}
	stats = get(StatsPath)
	if stats["token_refreshes"] != 1.0 || stats["refresh_reuse_detected"] != 1.0 {
		t.Errorf("stats token_refreshes=%v refresh_reuse_detected=%v, want 1 and 1", stats["token_refreshes"], stats["refresh_reuse_detected"])
	}
	// The refreshed access token opens a socket; the wham check answers.
	c, st, err = dial(t.Context(), ts, ChatGPTPath, goodHeaders(refreshed.AccessToken, "acct-oauth"))
	if err != nil {
		t.Fatalf("dial with a refreshed token: %d %v", st, err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	req, _ = http.NewRequestWithContext(t.Context(), "GET", ts.URL+"/backend-api/wham/accounts/check", nil)
	req.Header.Set("Authorization", "Bearer "+refreshed.AccessToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"acct-oauth"`)) {
		t.Errorf("accounts check: %d %s", resp.StatusCode, b)
	}
}

func TestNewValidates(t *testing.T) {
	_, err := New(Config{UpgradeLimit: -1, UpgradeWindow: -time.Second, MaxFrameBytes: -1, SocketLifetime: -1,
		DeltaInterval: -1, InstantLimit: -1, MaxOpenSockets: -1, AcceptTokens: map[string]string{"": "a", "t": ""},
		Faults: Faults{FirstByteDelay: -1, InterEventDelay: -1, CloseAfterEvents: -1, Upgrade5xxShare: 1.5, Upgrade5xxStatus: 404, RetryAfter403: -1}})
	if err == nil {
		t.Fatal("New accepted a bad config")
	}
	for _, name := range []string{"UpgradeLimit", "UpgradeWindow", "MaxFrameBytes", "SocketLifetime", "DeltaInterval", "InstantLimit",
		"MaxOpenSockets", "empty token", "empty account", "FirstByteDelay", "InterEventDelay", "CloseAfterEvents", "Upgrade5xxShare",
		"Upgrade5xxStatus", "RetryAfter403"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s: %v", name, err)
		}
	}
	if _, err := New(Config{}); err != nil {
		t.Errorf("zero Config: %v", err)
	}
}

func TestRetryAfter403(t *testing.T) {
	_, ts := testServer(t, Config{UpgradeLimit: 1, Faults: Faults{RetryAfter403: 1500 * time.Millisecond}})
	_ = mustDial(t, ts).CloseNow()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, wsURL(ts, ChatGPTPath), &websocket.DialOptions{HTTPHeader: goodHeaders(testToken, testAccount)})
	if err == nil || resp == nil {
		t.Fatalf("second dial: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 || resp.Header.Get("Retry-After") != "2" {
		t.Errorf("403 status %d retry-after %q, want 403 and 2", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}
