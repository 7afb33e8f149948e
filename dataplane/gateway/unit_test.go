package gateway

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
)

func TestNewRequiresKeyOffLoopback(t *testing.T) {
	p, err := pool.New(pool.Config{Credentials: noUpstream("no upstream")})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, err = New(Config{Router: newRouter(t, "tok", "acct"), Pool: p, ListenAddr: ":17645"})
	if err == nil || !strings.Contains(err.Error(), "field APIKey is required") || !strings.Contains(err.Error(), ":17645") {
		t.Errorf("New(non-loopback, no key) = %v, want an error naming APIKey and the address", err)
	}
	_, err = New(Config{ListenAddr: "127.0.0.1:1", AllowedOrigins: []string{"not an origin"}, PingInterval: -1})
	for _, want := range []string{"field Router is required", "field Pool is required", "field AllowedOrigins[0]", "field PingInterval"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New(bad config) = %v, want it to mention %q", err, want)
		}
	}
}

// Off loopback a key is required on every route but /healthz and HEAD,
// and any Host is accepted. (A gateway configured for 0.0.0.0, served on
// a loopback test listener: the test binds no public interface.)
func TestListenerSecurityNetwork(t *testing.T) {
	e := newUnitEnv(t, unitOptions{mutate: func(c *Config) {
		c.ListenAddr = "0.0.0.0:17645"
		c.APIKey = "team-key-123"
	}})
	tests := []struct {
		name       string
		method     string
		path       string
		hdr        map[string]string
		wantStatus int
	}{
		{"right x-api-key", "POST", "/v1/messages", map[string]string{"X-Api-Key": "team-key-123"}, 200},
		{"right bearer", "POST", "/v1/messages", map[string]string{"Authorization": "Bearer team-key-123"}, 200},
		{"wrong key", "POST", "/v1/messages", map[string]string{"X-Api-Key": "team-key-124"}, 401},
		{"prefix of key", "POST", "/v1/messages", map[string]string{"X-Api-Key": "team-key"}, 401},
		{"no key", "POST", "/v1/messages", nil, 401},
		{"no key for models", "GET", "/v1/models", nil, 401},
		{"no key for count_tokens", "POST", "/v1/messages/count_tokens", nil, 401},
		{"any host with key", "POST", "/v1/messages", map[string]string{"X-Api-Key": "team-key-123", "Host": "dataplane.internal:17645"}, 200},
		{"healthz needs no key", "GET", "/healthz", nil, 200},
		{"readyz needs no key", "GET", "/readyz", nil, 200},
		{"HEAD needs no key", "HEAD", "/", nil, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader
			if tt.method == "POST" {
				body = strings.NewReader(MessagesBody(false, "#sim reply ok"))
			}
			req, _ := http.NewRequestWithContext(t.Context(), tt.method, e.url+tt.path, body)
			req.Header.Set("Content-Type", "application/json")
			for k, v := range tt.hdr {
				if k == "Host" {
					req.Host = v
					continue
				}
				req.Header.Set(k, v)
			}
			resp, err := e.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantStatus, ReadAll(t, resp))
			}
			if tt.wantStatus == 401 {
				if eb := ReadError(t, resp); eb.Error.Type != "authentication_error" {
					t.Errorf("error type %q, want authentication_error", eb.Error.Type)
				}
				return
			}
			ReadAll(t, resp)
		})
	}
}

func compress(t *testing.T, coding string, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.WriteCloser
	switch coding {
	case "gzip":
		w = gzip.NewWriter(&buf)
	case "deflate":
		w = zlib.NewWriter(&buf)
	case "raw-deflate":
		w, _ = flate.NewWriter(&buf, flate.DefaultCompression)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatalf("%s: %v", coding, err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("%s: %v", coding, err)
	}
	return buf.Bytes()
}

// Config.MaxBodyBytes bounds a body as sent and after decoding.
func TestBodyLimitsAndEncodings(t *testing.T) {
	const limit = 64 << 10
	e := newUnitEnv(t, unitOptions{mutate: func(c *Config) { c.MaxBodyBytes = limit }})
	small := []byte(MessagesBody(false, "#sim reply decoded fine"))
	// A body that fits compressed but not decompressed.
	bomb := []byte(MessagesBody(false, strings.Repeat("a", 2*limit)))
	tests := []struct {
		name       string
		body       []byte
		encoding   string
		wantStatus int
		wantType   string
		wantMsg    string
	}{
		{"gzip", compress(t, "gzip", small), "gzip", 200, "", ""},
		{"deflate (zlib)", compress(t, "deflate", small), "deflate", 200, "", ""},
		{"deflate (raw)", compress(t, "raw-deflate", small), "deflate", 200, "", ""},
		{"identity", small, "identity", 200, "", ""},
		{"too large", bytes.Repeat([]byte(" "), limit+1), "", 413, "request_too_large", "limit"},
		{"too large after gzip", compress(t, "gzip", bomb), "gzip", 413, "request_too_large", "limit"},
		{"brotli refused", small, "br", 415, "invalid_request_error", "gzip, deflate"},
		{"corrupt gzip", []byte("not gzip at all"), "gzip", 400, "invalid_request_error", "gzip"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tt.encoding != "" {
				hdr["Content-Encoding"] = tt.encoding
			}
			resp := e.post(t, "/v1/messages", string(tt.body), hdr)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d: %.300s", resp.StatusCode, tt.wantStatus, ReadAll(t, resp))
			}
			if tt.wantStatus == 200 {
				var msg struct{ Content []struct{ Text string } }
				body := ReadAll(t, resp)
				if err := json.Unmarshal(body, &msg); err != nil {
					t.Fatalf("body %.300s: %v", body, err)
				}
				if len(msg.Content) != 1 || msg.Content[0].Text != "decoded fine" {
					t.Errorf("content = %+v, want \"decoded fine\"", msg.Content)
				}
				return
			}
			eb := ReadError(t, resp)
			if eb.Error.Type != tt.wantType || !strings.Contains(eb.Error.Message, tt.wantMsg) {
				t.Errorf("error = %+v, want type %s mentioning %q", eb.Error, tt.wantType, tt.wantMsg)
			}
		})
	}
}

var sessionHeader = map[string]string{"X-Claude-Code-Session-Id": "0f7e1c2a-1111-4222-8333-944455556666"}

// A refusal from the pool's Admitter makes the next attempt wait exactly
// its hint. (The assembly's admission client and control plane compute
// the hint from real time; this test fixes it.)
func TestAdmissionRefusalWaitsExactlyTheHint(t *testing.T) {
	var clk *FakeClock
	var mu sync.Mutex
	var asked []time.Duration
	admit := pool.AdmitterFunc(func(ctx context.Context, acct string) error {
		mu.Lock()
		defer mu.Unlock()
		if acct != account.Key(simAccount) {
			t.Errorf("Admit account %q, want %q", acct, account.Key(simAccount))
		}
		asked = append(asked, clk.Now().Sub(Epoch))
		if len(asked) <= 2 {
			return &control.RefusedError{RetryAfter: 4 * time.Second, RequiredWait: 9 * time.Second}
		}
		return nil
	})
	e := newUnitEnv(t, unitOptions{admitter: admit, budget: pacing.Budget{IdleTimeout: 120 * time.Second, TotalTimeout: 600 * time.Second, MaxRetries: 5}})
	clk = e.clock
	resp := e.post(t, "/v1/messages", MessagesBody(false, "#sim reply admitted"), sessionHeader)
	body := ReadAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d body %s, want 200", resp.StatusCode, body)
	}
	if want := []time.Duration{0, 4 * time.Second, 8 * time.Second}; !slices.Equal(asked, want) {
		t.Errorf("admission asked at %v, want %v", asked, want)
	}
}

// Refusals until the retries run out: 429 rate_limit_error with a
// retry-after in [h, ceil(1.25 h)], waits of exactly the hint.
func TestAdmissionRefusalsExhausted(t *testing.T) {
	admit := pool.AdmitterFunc(func(context.Context, string) error {
		return &control.RefusedError{RetryAfter: 4 * time.Second}
	})
	e := newUnitEnv(t, unitOptions{admitter: admit, budget: pacing.Budget{IdleTimeout: 120 * time.Second, TotalTimeout: 600 * time.Second, MaxRetries: 2}})
	resp := e.post(t, "/v1/messages", MessagesBody(true, "#sim reply x"), sessionHeader)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "4" && ra != "5" {
		t.Errorf("retry-after %q, want 4 or 5", ra)
	}
	if eb := ReadError(t, resp); eb.Error.Type != "rate_limit_error" {
		t.Errorf("error %+v, want rate_limit_error", eb.Error)
	}
	if got, want := e.clock.Sleeps(), []time.Duration{4 * time.Second, 4 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
	if st := e.sim.Stats(); st.Upgrades != 0 {
		t.Errorf("sim upgrades = %d, want 0", st.Upgrades)
	}
}

// Config.Budgets gives every turn its account's budget: one set for the
// turn's account bounds its attempts; a budget Budgets refuses, or one set
// for another account, leaves the default. The Health allows more failure
// retries than any budget here, so the budget is what bounds the attempts.
func TestBudgetsAreConsulted(t *testing.T) {
	valid := pacing.Budget{IdleTimeout: 120 * time.Second, TotalTimeout: 600 * time.Second}
	tests := []struct {
		name         string
		account      string        // whose budget is set
		budget       pacing.Budget // the budget set
		wantAttempts int
	}{
		{"no retries", simAccount, pacing.Budget{IdleTimeout: valid.IdleTimeout, TotalTimeout: valid.TotalTimeout, MaxRetries: 0}, 1},
		{"one retry", simAccount, pacing.Budget{IdleTimeout: valid.IdleTimeout, TotalTimeout: valid.TotalTimeout, MaxRetries: 1}, 2},
		{"zero refused: the default (2 retries)", simAccount, pacing.Budget{}, 3},
		{"invalid refused: the default (2 retries)", simAccount, pacing.Budget{IdleTimeout: -1, TotalTimeout: valid.TotalTimeout, MaxRetries: 1}, 3},
		{"another account's: the default (2 retries)", "acct-other", pacing.Budget{IdleTimeout: valid.IdleTimeout, TotalTimeout: valid.TotalTimeout, MaxRetries: 0}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newUnitEnv(t, unitOptions{budget: pacing.Budget{IdleTimeout: valid.IdleTimeout, TotalTimeout: valid.TotalTimeout, MaxRetries: 2},
				mutate: func(c *Config) {
					h, err := retry.NewHealth(retry.HealthConfig{FailureRetries: 5, Clock: c.RetryClock})
					if err != nil {
						t.Fatal(err)
					}
					c.Health = h
					err = c.Budgets.Set(account.Key(tt.account), tt.budget)
					if refused := tt.budget.IdleTimeout <= 0; refused != (err != nil) {
						t.Fatalf("Budgets.Set(%+v) = %v; want it refused only when invalid", tt.budget, err)
					}
				}})
			resp := e.post(t, "/v1/messages", MessagesBody(false, "#sim fail server_error"), nil)
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d, want 502: %s", resp.StatusCode, ReadAll(t, resp))
			}
			ReadAll(t, resp)
			if n := e.sim.Stats().Errors["server_error"]; n != int64(tt.wantAttempts) {
				t.Errorf("the sim failed %d responses, want %d attempts", n, tt.wantAttempts)
			}
		})
	}
}

// /readyz answers 503 with the reason while Config.Ready says the data
// plane cannot serve a turn, and 200 once it can; /healthz answers 200
// throughout (liveness, not readiness).
func TestReadyz(t *testing.T) {
	var notReady atomic.Pointer[string]
	reason := "no ChatGPT access token from the credential broker yet"
	notReady.Store(&reason)
	e := newUnitEnv(t, unitOptions{mutate: func(c *Config) {
		c.Ready = func() error {
			if r := notReady.Load(); r != nil {
				return errors.New(*r)
			}
			return nil
		}
	}})
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := e.client.Get(e.url + path)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(ReadAll(t, resp))
	}
	if code, body := get("/readyz"); code != 503 || body != `{"ok":false,"service":"clodex-dataplane","reason":"no ChatGPT access token from the credential broker yet"}` {
		t.Errorf("/readyz while not ready = %d %s, want 503 with the reason", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz while not ready = %d, want 200 (alive)", code)
	}
	notReady.Store(nil)
	if code, body := get("/readyz"); code != 200 || body != `{"ok":true,"service":"clodex-dataplane"}` {
		t.Errorf("/readyz once ready = %d %s, want 200", code, body)
	}
}
