package gateway

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/pacing"
)

func TestUpgradeThrottleBecomes429(t *testing.T) {
	tests := []struct {
		name          string
		retryAfter403 time.Duration
		minRetryAfter int // the header is uniform in [h, ceil(1.25 h)]
		maxRetryAfter int
		wantSleeps    []time.Duration
	}{
		// Two retries after a throttle: max(rung, hint) × (1 + 0.25 × 0.5).
		{"edge sends retry-after", 7 * time.Second, 7, 9, []time.Duration{7875 * time.Millisecond, 7875 * time.Millisecond}},
		{"edge sends none: default hint", 0, 5, 7, []time.Duration{5625 * time.Millisecond, 5625 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{
				sim: codexsim.Config{UpgradeLimit: 1, Faults: codexsim.Faults{RetryAfter403: tt.retryAfter403}},
				mutate: func(c *Config) {
					c.Budget = pacing.Budget{IdleTimeout: 120 * time.Second, TotalTimeout: 600 * time.Second, MaxRetries: 2}
					c.RetryRand = func() float64 { return 0.5 }
				},
			})
			first := e.post(t, "/v1/messages", messagesBody(false, "#sim reply ok"), nil)
			if first.StatusCode != http.StatusOK {
				t.Fatalf("first request: status %d, want 200: %s", first.StatusCode, readAll(t, first))
			}
			readAll(t, first)
			for _, stream := range []bool{true, false} {
				resp := e.post(t, "/v1/messages?beta=true", messagesBody(stream, "#sim reply ok"), nil)
				if resp.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("stream=%v: status %d, want 429: %s", stream, resp.StatusCode, readAll(t, resp))
				}
				got, err := strconv.Atoi(resp.Header.Get("Retry-After"))
				if err != nil || got < tt.minRetryAfter || got > tt.maxRetryAfter {
					t.Errorf("stream=%v: retry-after = %q, want an integer in [%d, %d]", stream, resp.Header.Get("Retry-After"), tt.minRetryAfter, tt.maxRetryAfter)
				}
				if v := resp.Header.Get("X-Should-Retry"); v != "" {
					t.Errorf("stream=%v: x-should-retry = %q, want none for a throttle", stream, v)
				}
				eb := readError(t, resp)
				if eb.Error.Type != "rate_limit_error" || !strings.Contains(eb.Error.Message, "403") {
					t.Errorf("stream=%v: error = %+v, want rate_limit_error mentioning the 403", stream, eb.Error)
				}
			}
			// Each request: the first attempt and two retries, all refused.
			if st := e.sim.Stats(); st.Upgrade403s != 6 {
				t.Errorf("sim upgrade_403s = %d, want 6 (3 attempts for each of 2 requests)", st.Upgrade403s)
			}
			want := append(append([]time.Duration(nil), tt.wantSleeps...), tt.wantSleeps...)
			if got := e.clock.Sleeps(); !slices.Equal(got, want) {
				t.Errorf("waits between attempts = %v, want %v", got, want)
			}
		})
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
				resp := e.post(t, "/v1/messages", messagesBody(stream, tt.text), nil)
				if resp.StatusCode != tt.wantStatus {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantStatus, readAll(t, resp))
				}
				if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("content-type %q, want application/json", ct)
				}
				eb := readError(t, resp)
				if eb.Error.Type != tt.wantType || !strings.Contains(eb.Error.Message, tt.wantMsg) {
					t.Errorf("error = %+v, want type %s mentioning %q", eb.Error, tt.wantType, tt.wantMsg)
				}
			})
		}
	}
}

// After output, a failure ends the SSE stream with an error event and no
// message_stop.
func TestFailureAfterOutputIsSSEError(t *testing.T) {
	e := newEnv(t, envOptions{sim: codexsim.Config{Faults: codexsim.Faults{CloseAfterEvents: 8}}})
	resp := e.post(t, "/v1/messages", messagesBody(true, "#sim reply "+strings.Repeat("word ", 100)), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	body := string(readAll(t, resp))
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
			resp := e.post(t, "/v1/messages", messagesBody(true, "hi"), nil)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			eb := readError(t, resp)
			if eb.Error.Type != tt.wantType || !strings.Contains(eb.Error.Message, strconv.Itoa(tt.upgradeStatus)) {
				t.Errorf("error = %+v, want type %s naming the upstream %d", eb.Error, tt.wantType, tt.upgradeStatus)
			}
		})
	}
}

func TestUnreachableUpstreamIs502(t *testing.T) {
	e := newEnv(t, envOptions{mutate: func(c *Config) {
		c.Dialer = UpstreamDialer(upstream.DialOptions{URL: "ws://127.0.0.1:1/backend-api/codex/responses"})
	}})
	resp := e.post(t, "/v1/messages", messagesBody(true, "hi"), nil)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	if eb := readError(t, resp); eb.Error.Type != "api_error" {
		t.Errorf("error type %q, want api_error", eb.Error.Type)
	}
}

func TestCredentialUnavailableIs401(t *testing.T) {
	e := newEnv(t, envOptions{mutate: func(c *Config) { c.Credentials = NoRefresh(failingSource{}) }})
	resp := e.post(t, "/v1/messages", messagesBody(true, "hi"), nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	eb := readError(t, resp)
	if eb.Error.Type != "authentication_error" || strings.Contains(eb.Error.Message, "SECRET") {
		t.Errorf("error = %+v, want authentication_error without the cause's text", eb.Error)
	}
}

type failingSource struct{}

func (failingSource) Credential(context.Context) (credentials.Credential, error) {
	return credentials.Credential{}, errors.New("refresh rejected for SECRET-token")
}
