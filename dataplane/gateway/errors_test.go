package gateway_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node"
	"github.com/clodex/clodex/internal/pacing"
)

// policyWithRetries is the default policy with maxRetries, resolved the
// way the data plane reads CLODEX_UPSTREAM_MAX_RETRIES.
func policyWithRetries(t *testing.T, maxRetries int) pacing.Policy {
	t.Helper()
	p, notices := pacing.PolicyFromEnv(func(k string) (string, bool) {
		if k == pacing.EnvMaxRetries {
			return strconv.Itoa(maxRetries), true
		}
		return "", false
	})
	if len(notices) != 0 || p.Budget.MaxRetries != maxRetries {
		t.Fatalf("policy for %d retries: %+v, notices %v", maxRetries, p, notices)
	}
	return p
}

// adaptiveOff writes the embedded control plane's policy file under a new
// data directory: the account's policy p with adaptive mode (the learned
// throttle) off, as clodexctl set-adaptive ACCOUNT off stores it.
func adaptiveOff(t *testing.T, accountID string, p pacing.Policy) string {
	t.Helper()
	dir := t.TempDir()
	rec := map[string]any{"version": 1, "rate_per_minute": p.RatePerMinute, "burst": p.Burst,
		"idle_timeout_ms": p.Budget.IdleTimeout.Milliseconds(), "total_timeout_ms": p.Budget.TotalTimeout.Milliseconds(),
		"max_retries": p.Budget.MaxRetries, "adaptive": false}
	b, err := json.Marshal(map[string]any{"format": 1, "version": 1, "accounts": map[string]any{account.Key(accountID): rec}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "policy.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// An upgrade throttled with 403 is a 429 with the edge's hint (the
// learned throttle off). With two failure retries the first request
// retries twice, waiting max(rung, hint) × (1 + 0.25 × 0.5); the account
// is then failing, so the second request makes one attempt and hands its
// 429 to the client at once.
func TestUpgradeThrottleBecomes429(t *testing.T) {
	tests := []struct {
		name          string
		retryAfter403 time.Duration
		minRetryAfter int // the header is uniform in [h, ceil(1.25 h)]
		maxRetryAfter int
		wantSleeps    []time.Duration
	}{
		{"edge sends retry-after", 7 * time.Second, 7, 9, []time.Duration{7875 * time.Millisecond, 7875 * time.Millisecond}},
		{"edge sends none: default hint", 0, 5, 7, []time.Duration{5625 * time.Millisecond, 5625 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{
				sim: codexsim.Config{UpgradeLimit: 1, Faults: codexsim.Faults{RetryAfter403: tt.retryAfter403}},
				mutate: func(c *node.Config) {
					c.Policy = policyWithRetries(t, 2)
					c.DataDir = adaptiveOff(t, simAccount, c.Policy)
					c.FailureRetries = 2
					c.RetryRand = func() float64 { return 0.5 }
				},
			})
			first := e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply ok"), nil)
			if first.StatusCode != http.StatusOK {
				t.Fatalf("first request: status %d, want 200: %s", first.StatusCode, gateway.ReadAll(t, first))
			}
			gateway.ReadAll(t, first)
			for _, stream := range []bool{true, false} {
				resp := e.post(t, "/v1/messages?beta=true", gateway.MessagesBody(stream, "#sim reply ok"), nil)
				if resp.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("stream=%v: status %d, want 429: %s", stream, resp.StatusCode, gateway.ReadAll(t, resp))
				}
				got, err := strconv.Atoi(resp.Header.Get("Retry-After"))
				if err != nil || got < tt.minRetryAfter || got > tt.maxRetryAfter {
					t.Errorf("stream=%v: retry-after = %q, want an integer in [%d, %d]", stream, resp.Header.Get("Retry-After"), tt.minRetryAfter, tt.maxRetryAfter)
				}
				if v := resp.Header.Get("X-Should-Retry"); v != "true" {
					t.Errorf("stream=%v: x-should-retry = %q, want true: a throttle passes", stream, v)
				}
				eb := gateway.ReadError(t, resp)
				if eb.Error.Type != "rate_limit_error" || !strings.Contains(eb.Error.Message, "403") {
					t.Errorf("stream=%v: error = %+v, want rate_limit_error mentioning the 403", stream, eb.Error)
				}
			}
			// The first request: its attempt and two retries; the second: one attempt.
			if st := e.sim.Stats(); st.Upgrade403s != 4 {
				t.Errorf("sim upgrade_403s = %d, want 4 (3 attempts, then 1)", st.Upgrade403s)
			}
			if got := e.clock.Sleeps(); !slices.Equal(got, tt.wantSleeps) {
				t.Errorf("waits between attempts = %v, want %v", got, tt.wantSleeps)
			}
		})
	}
}

// With the learned throttle (the default) an upgrade 403 without a
// retry-after pauses the account for the learned interval (60 s): the
// request that met the 403 and the next new conversation are told to
// come back when the pause ends, and nothing dials into the pause.
func TestUpgradeThrottleLearned(t *testing.T) {
	e := newEnv(t, envOptions{
		sim: codexsim.Config{UpgradeLimit: 1},
		mutate: func(c *node.Config) {
			c.RetryRand = func() float64 { return 0.5 }
		},
	})
	first := e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply ok"), nil)
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first request: status %d, want 200: %s", first.StatusCode, gateway.ReadAll(t, first))
	}
	gateway.ReadAll(t, first)
	// The request that meets the 403 gets a 429 (its retry may run before
	// the control plane's pause reaches the data plane: the retry clock is
	// fake here). Once the pause is known, a new conversation is told to
	// come back when it ends, without a dial.
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply ok"), nil)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("request after the 403: status %d, want 429: %s", resp.StatusCode, gateway.ReadAll(t, resp))
	}
	gateway.ReadAll(t, resp)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply ok"), nil)
		got, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		gateway.ReadAll(t, resp)
		if resp.StatusCode == http.StatusTooManyRequests && err == nil && got >= 50 && got <= 76 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new conversation was told to wait out the 60 s pause: status %d, retry-after %q", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := e.sim.Stats().Upgrade403s
	resp = e.post(t, "/v1/messages", gateway.MessagesBody(true, "#sim reply ok"), nil)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a new conversation during the pause: status %d, want 429", resp.StatusCode)
	}
	gateway.ReadAll(t, resp)
	if st := e.sim.Stats(); st.Upgrade403s != before || st.Upgrades != 1 {
		t.Errorf("sim: %d upgrades, %d upgrade 403s (%d before); want 1 upgrade and no 403 during the pause", st.Upgrades, st.Upgrade403s, before)
	}
}

// An output-less response.failed is never an empty 200.
func TestOutputlessFailureIsAnError(t *testing.T) {
	tests := []struct {
		name       string
		text       string
		wantStatus int
		wantType   string
		wantMsg    string
	}{
		{"server_error", "#sim fail server_error", http.StatusBadGateway, "api_error", "no output"},
		{"usage limit", "#sim fail usage_limit_reached", http.StatusTooManyRequests, "rate_limit_error", "usage_limit_reached"},
		{"context length", "#sim context-length", http.StatusBadRequest, "invalid_request_error", "prompt is too long"},
	}
	for _, tt := range tests {
		for _, stream := range []bool{true, false} {
			name := tt.name + map[bool]string{true: "/stream", false: "/json"}[stream]
			t.Run(name, func(t *testing.T) {
				e := newEnv(t, envOptions{})
				resp := e.post(t, "/v1/messages", gateway.MessagesBody(stream, tt.text), nil)
				if resp.StatusCode != tt.wantStatus {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantStatus, gateway.ReadAll(t, resp))
				}
				if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("content-type %q, want application/json", ct)
				}
				eb := gateway.ReadError(t, resp)
				if eb.Error.Type != tt.wantType || !strings.Contains(eb.Error.Message, tt.wantMsg) {
					t.Errorf("error = %+v, want type %s mentioning %q", eb.Error, tt.wantType, tt.wantMsg)
				}
			})
		}
	}
}

func TestUpgradeFailureStatus(t *testing.T) {
	tests := []struct {
		upgradeStatus int
		wantStatus    int
		wantType      string
	}{
		{503, 529, "overloaded_error"},
		{500, 502, "api_error"},
		{502, 502, "api_error"},
	}
	for _, tt := range tests {
		t.Run(http.StatusText(tt.upgradeStatus), func(t *testing.T) {
			e := newEnv(t, envOptions{sim: codexsim.Config{Faults: codexsim.Faults{Upgrade5xxShare: 1, Upgrade5xxStatus: tt.upgradeStatus}}})
			resp := e.post(t, "/v1/messages", gateway.MessagesBody(true, "hi"), nil)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			eb := gateway.ReadError(t, resp)
			if eb.Error.Type != tt.wantType || !strings.Contains(eb.Error.Message, strconv.Itoa(tt.upgradeStatus)) {
				t.Errorf("error = %+v, want type %s naming the upstream %d", eb.Error, tt.wantType, tt.upgradeStatus)
			}
		})
	}
}

func TestUnreachableUpstreamIs502(t *testing.T) {
	e := newEnv(t, envOptions{mutate: func(c *node.Config) {
		c.UpstreamURL = "ws://127.0.0.1:1/backend-api/codex/responses"
	}})
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(true, "hi"), nil)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	if eb := gateway.ReadError(t, resp); eb.Error.Type != "api_error" {
		t.Errorf("error type %q, want api_error", eb.Error.Type)
	}
}

// A usage limit is never retried inside the data plane. One that resets
// later than 60 s is answered at once with x-should-retry: false, no
// retry-after (a client that ignores x-should-retry would wait it out) and
// its reset time in the message and the anthropic-ratelimit-*-reset
// headers; one that resets sooner is a 429 whose retry-after is the reset.
// The backend's resets_in_seconds is dated from the data plane's clock
// (2026-01-02T03:04:05Z).
func TestUsageLimitReset(t *testing.T) {
	tests := []struct {
		name            string
		resetSecs       int
		wantShouldRetry string
		wantRetryAfter  string // rand 0.5: h + floor(0.5 × (ceil(1.25 h) − h + 1))
		wantReset       string
		wantMsg         string
	}{
		{"resets in 4 h", 4 * 3600, "false", "", "2026-01-02T07:04:05Z",
			"The ChatGPT plan's usage limit was reached (usage_limit_reached, plus plan); it resets in 4h0m (at 2026-01-02T07:04:05Z); retrying before then will not help"},
		{"resets in 30 s", 30, "true", "34", "2026-01-02T03:04:35Z",
			"The ChatGPT plan's usage limit was reached (usage_limit_reached, plus plan); it resets in 30s (at 2026-01-02T03:04:35Z); retry after 34s"},
	}
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			name := tt.name + map[bool]string{true: "/stream", false: "/json"}[stream]
			t.Run(name, func(t *testing.T) {
				up := newWSUpstream(t, func(int) []string { return []string{usageLimitFrame(tt.resetSecs)} })
				e := newEnv(t, envOptions{mutate: func(c *node.Config) {
					c.UpstreamURL = up.url
					c.Policy = policyWithRetries(t, 2)
					c.RetryRand = func() float64 { return 0.5 }
				}})
				resp := e.post(t, "/v1/messages", gateway.MessagesBody(stream, "hello"), nil)
				if resp.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("status %d, want 429: %s", resp.StatusCode, gateway.ReadAll(t, resp))
				}
				if got := resp.Header.Get("X-Should-Retry"); got != tt.wantShouldRetry {
					t.Errorf("x-should-retry = %q, want %q", got, tt.wantShouldRetry)
				}
				if got := resp.Header.Get("Retry-After"); got != tt.wantRetryAfter {
					t.Errorf("retry-after = %q, want %q", got, tt.wantRetryAfter)
				}
				for _, k := range []string{"anthropic-ratelimit-requests-reset", "anthropic-ratelimit-tokens-reset"} {
					if got := resp.Header.Get(k); got != tt.wantReset {
						t.Errorf("%s = %q, want %q", k, got, tt.wantReset)
					}
				}
				eb := gateway.ReadError(t, resp)
				if eb.Error.Type != "rate_limit_error" || eb.Error.Message != tt.wantMsg {
					t.Errorf("error = %+v, want rate_limit_error %q", eb.Error, tt.wantMsg)
				}
				if creates, _ := up.stats(); creates != 1 {
					t.Errorf("upstream got %d response.create, want 1: a usage limit is not retried here", creates)
				}
				if sleeps := e.clock.Sleeps(); len(sleeps) != 0 {
					t.Errorf("waits between attempts = %v, want none", sleeps)
				}
			})
		}
	}
}

// After output, a failure ends the SSE stream with an error event and no
// message_stop.
func TestFailureAfterOutputIsSSEError(t *testing.T) {
	e := newEnv(t, envOptions{sim: codexsim.Config{Faults: codexsim.Faults{CloseAfterEvents: 8}}})
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(true, "#sim reply "+strings.Repeat("word ", 100)), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	body := string(gateway.ReadAll(t, resp))
	if !strings.Contains(body, "event: content_block_delta") {
		t.Fatalf("body has no content before the failure:\n%s", body)
	}
	if !strings.Contains(body, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"") {
		t.Errorf("body does not end with an api_error event:\n%s", body)
	}
	if strings.Contains(body, "message_stop") {
		t.Errorf("body has message_stop after a failure:\n%s", body)
	}
}
