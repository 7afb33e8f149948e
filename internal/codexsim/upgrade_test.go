package codexsim

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

func TestUpgradeChecks(t *testing.T) {
	srv, ts := testServer(t, Config{UpgradeLimit: 1})
	noBeta := func(h http.Header) http.Header { h.Del("OpenAI-Beta"); return h }
	tests := []struct {
		name       string
		path       string
		header     http.Header
		wantStatus int
	}{
		{"no token", ChatGPTPath, noBeta(http.Header{"Chatgpt-Account-Id": {testAccount}}), 401},
		{"unknown token, also no beta", ChatGPTPath, noBeta(goodHeaders("sk-wrong", testAccount)), 401},
		{"basic scheme", ChatGPTPath, http.Header{"Authorization": {"Basic " + testToken}, "Openai-Beta": {BetaHeaderValue}}, 401},
		{"chatgpt path without account header, also no beta", ChatGPTPath, noBeta(goodHeaders(testToken, "")), 401},
		{"chatgpt path with other account", ChatGPTPath, goodHeaders(testToken, "acct-other"), 401},
		{"api path with other account", APIKeyPath, goodHeaders(testToken, "acct-other"), 401},
		{"chatgpt path without beta", ChatGPTPath, noBeta(goodHeaders(testToken, testAccount)), 400},
		{"api path without beta", APIKeyPath, noBeta(goodHeaders(testToken, "")), 400},
		{"wrong beta", APIKeyPath, func() http.Header {
			h := goodHeaders(testToken, "")
			h.Set("OpenAI-Beta", "responses_websockets=2025-01-01")
			return h
		}(), 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, status, err := dial(t.Context(), ts, tt.path, tt.header)
			if err == nil {
				_ = c.CloseNow()
				t.Fatalf("dial succeeded, want HTTP %d", tt.wantStatus)
			}
			if status != tt.wantStatus {
				t.Errorf("upgrade status = %d, want %d (err %v)", status, tt.wantStatus, err)
			}
		})
	}
	st := srv.Stats()
	if st.Upgrades != 0 || st.Upgrade403s != 0 {
		t.Errorf("after rejections: upgrades=%d upgrade_403s=%d, want 0 and 0", st.Upgrades, st.Upgrade403s)
	}
	if len(st.MaxUpgradesPerWindow) != 0 {
		t.Errorf("max_upgrades_per_window = %v, want empty: rejections must not count", st.MaxUpgradesPerWindow)
	}
	// With a limit of 1, the first good upgrade must still be accepted:
	// none of the rejections above counted toward the window.
	c, status, err := dial(t.Context(), ts, APIKeyPath, goodHeaders(testToken, ""))
	if err != nil {
		t.Fatalf("good api-path dial (no account header): status %d: %v", status, err)
	}
	_ = c.CloseNow()
	if st := srv.Stats(); st.Upgrades != 1 || st.Upgrade401s != 6 || st.Upgrade400s != 3 {
		t.Errorf("stats upgrades=%d upgrade_401s=%d upgrade_400s=%d, want 1, 6, 3", st.Upgrades, st.Upgrade401s, st.Upgrade400s)
	}
}

func TestUpgradeNotWebSocket(t *testing.T) {
	_, ts := testServer(t, Config{})
	req, _ := http.NewRequestWithContext(t.Context(), "GET", ts.URL+ChatGPTPath, nil)
	req.Header = goodHeaders(testToken, testAccount)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Errorf("read the plain GET's body: %v", err)
	}
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Errorf("plain GET status = %d, want 426", resp.StatusCode)
	}
}

// TestThrottleAccuracy: 100 upgrades in 30 s for one account with N = 80
// give exactly 20 403s; other accounts are unaffected.
func TestThrottleAccuracy(t *testing.T) {
	clock := newFakeClock()
	srv, ts := testServer(t, Config{
		Clock:        clock.Now,
		AcceptTokens: map[string]string{"tok-a": "acct-a", "tok-b": "acct-b"},
	})
	var ok, forbidden, other int
	for i := range 100 {
		c, status, err := dial(t.Context(), ts, ChatGPTPath, goodHeaders("tok-a", "acct-a"))
		switch {
		case err == nil:
			ok++
			_ = c.CloseNow()
		case status == http.StatusForbidden:
			forbidden++
			if i < 80 {
				t.Errorf("upgrade %d got 403, want the first 80 accepted", i)
			}
		default:
			other++
			t.Errorf("upgrade %d: status %d: %v", i, status, err)
		}
		clock.Advance(300 * time.Millisecond)
	}
	if ok != 80 || forbidden != 20 || other != 0 {
		t.Errorf("100 upgrades in 30s: %d accepted, %d 403, %d other; want 80, 20, 0", ok, forbidden, other)
	}
	c, status, err := dial(t.Context(), ts, ChatGPTPath, goodHeaders("tok-b", "acct-b"))
	if err != nil {
		t.Fatalf("other account while acct-a is throttled: status %d: %v", status, err)
	}
	_ = c.CloseNow()
	st := srv.Stats()
	if st.Upgrades != 81 || st.Upgrade403s != 20 {
		t.Errorf("stats upgrades=%d upgrade_403s=%d, want 81 and 20", st.Upgrades, st.Upgrade403s)
	}
	if st.MaxUpgradesPerWindow["acct-a"] != 80 || st.MaxUpgradesPerWindow["acct-b"] != 1 {
		t.Errorf("max_upgrades_per_window = %v, want acct-a 80, acct-b 1", st.MaxUpgradesPerWindow)
	}
	if st.UpgradesByAccount["acct-a"] != 80 || st.UpgradesByAccount["acct-b"] != 1 {
		t.Errorf("upgrades_by_account = %v, want acct-a 80, acct-b 1", st.UpgradesByAccount)
	}
	// The first upgrade was at t=0; at t=60s it leaves the window.
	clock.Advance(30 * time.Second) // now t=60s
	c, status, err = dial(t.Context(), ts, ChatGPTPath, goodHeaders("tok-a", "acct-a"))
	if err != nil {
		t.Fatalf("acct-a after its oldest upgrade left the window: status %d: %v", status, err)
	}
	_ = c.CloseNow()
	if _, status, err := dial(t.Context(), ts, ChatGPTPath, goodHeaders("tok-a", "acct-a")); err == nil || status != 403 {
		t.Errorf("second upgrade at t=60s: status %d, want 403 (only one slot freed)", status)
	}
}

func TestThrottleCountRejected(t *testing.T) {
	for _, countRejected := range []bool{false, true} {
		t.Run(fmt.Sprintf("count_rejected=%t", countRejected), func(t *testing.T) {
			clock := newFakeClock()
			_, ts := testServer(t, Config{Clock: clock.Now, UpgradeLimit: 1, UpgradeWindow: 10 * time.Second, CountRejected: countRejected})
			steps := []struct {
				at   time.Duration // since start
				want int
			}{
				{0, 101},
				{5 * time.Second, 403},
				// The accepted upgrade at t=0 leaves the window at t=10s; the
				// rejected one at t=5s still counts when count_rejected is on.
				{10 * time.Second, map[bool]int{false: 101, true: 403}[countRejected]},
			}
			var elapsed time.Duration
			for _, s := range steps {
				clock.Advance(s.at - elapsed)
				elapsed = s.at
				c, status, _ := dial(t.Context(), ts, ChatGPTPath, goodHeaders(testToken, testAccount))
				if c != nil {
					_ = c.CloseNow()
				}
				if status != s.want {
					t.Errorf("upgrade at t=%v: status %d, want %d", s.at, status, s.want)
				}
			}
		})
	}
}

func TestThrottleInstantAndOpenSockets(t *testing.T) {
	t.Run("instant", func(t *testing.T) {
		clock := newFakeClock()
		_, ts := testServer(t, Config{Clock: clock.Now, InstantLimit: 2})
		want := []int{101, 101, 403}
		for i, w := range want {
			c, status, _ := dial(t.Context(), ts, ChatGPTPath, goodHeaders(testToken, testAccount))
			if c != nil {
				_ = c.CloseNow()
			}
			if status != w {
				t.Errorf("upgrade %d within one second: status %d, want %d", i, status, w)
			}
		}
		clock.Advance(time.Second)
		c, status, _ := dial(t.Context(), ts, ChatGPTPath, goodHeaders(testToken, testAccount))
		if c != nil {
			_ = c.CloseNow()
		}
		if status != 101 {
			t.Errorf("upgrade one second later: status %d, want 101", status)
		}
	})
	t.Run("open sockets", func(t *testing.T) {
		srv, ts := testServer(t, Config{MaxOpenSockets: 1})
		c1 := mustDial(t, ts)
		if _, status, _ := dial(t.Context(), ts, ChatGPTPath, goodHeaders(testToken, testAccount)); status != 403 {
			t.Errorf("second concurrent socket: status %d, want 403", status)
		}
		// Closing the first socket frees the slot once the server sees it.
		c1.Close(1000, "")
		waitFor(t, func() bool { return srv.Stats().OpenSockets == 0 })
		c2 := mustDial(t, ts)
		_ = c2.CloseNow()
	})
}

// waitFor polls cond (the server notices a peer close asynchronously).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
