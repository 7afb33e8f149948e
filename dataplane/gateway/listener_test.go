package gateway

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestListenerSecurityLoopback(t *testing.T) {
	e := newEnv(t, envOptions{mutate: func(c *Config) { c.AllowedOrigins = []string{"http://localhost:3000"} }})
	okBody := messagesBody(false, "#sim reply fine")
	tests := []struct {
		name       string
		host       string // "" keeps the URL's host
		hdr        map[string]string
		wantStatus int
		wantType   string
		wantMsg    string
	}{
		{"any api key", "", map[string]string{"X-Api-Key": "whatever"}, 200, "", ""},
		{"bearer token", "", map[string]string{"Authorization": "Bearer anything"}, 200, "", ""},
		{"no key at all", "", nil, 200, "", ""},
		{"localhost host", "localhost:17645", nil, 200, "", ""},
		{"ipv6 loopback host", "[::1]:9", nil, 200, "", ""},
		{"missing content type", "", map[string]string{"Content-Type": ""}, 415, "invalid_request_error", "application/json"},
		{"text/plain", "", map[string]string{"Content-Type": "text/plain"}, 415, "invalid_request_error", "application/json"},
		{"json with charset", "", map[string]string{"Content-Type": "application/json; charset=utf-8"}, 200, "", ""},
		{"foreign host", "evil.example:17645", nil, 403, "permission_error", "evil.example"},
		{"rebinding host without port", "attacker.test", nil, 403, "permission_error", "loopback"},
		{"origin not allowed", "", map[string]string{"Origin": "https://evil.example"}, 403, "permission_error", "https://evil.example"},
		{"null origin", "", map[string]string{"Origin": "null"}, 403, "permission_error", "Origin"},
		{"allowed origin", "", map[string]string{"Origin": "http://localhost:3000"}, 200, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, e.url+"/v1/messages?beta=true", strings.NewReader(okBody))
			req.Header.Set("Content-Type", "application/json")
			for k, v := range tt.hdr {
				if v == "" {
					req.Header.Del(k)
				} else {
					req.Header.Set(k, v)
				}
			}
			if tt.host != "" {
				req.Host = tt.host
			}
			resp, err := e.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantStatus, readAll(t, resp))
			}
			if tt.wantStatus == 200 {
				readAll(t, resp)
				return
			}
			eb := readError(t, resp)
			if eb.Error.Type != tt.wantType || !strings.Contains(eb.Error.Message, tt.wantMsg) {
				t.Errorf("error = %+v, want type %s mentioning %q", eb.Error, tt.wantType, tt.wantMsg)
			}
		})
	}
}

func TestListenerSecurityNetwork(t *testing.T) {
	e := newEnv(t, envOptions{mutate: func(c *Config) {
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
		{"HEAD needs no key", "HEAD", "/", nil, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader
			if tt.method == "POST" {
				body = strings.NewReader(messagesBody(false, "#sim reply ok"))
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
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantStatus, readAll(t, resp))
			}
			if tt.wantStatus == 401 {
				if eb := readError(t, resp); eb.Error.Type != "authentication_error" {
					t.Errorf("error type %q, want authentication_error", eb.Error.Type)
				}
				return
			}
			readAll(t, resp)
		})
	}
}

func TestNewRequiresKeyOffLoopback(t *testing.T) {
	_, err := New(Config{Credentials: NoRefresh(failingSource{}), ListenAddr: ":17645"})
	if err == nil || !strings.Contains(err.Error(), "APIKey is required") || !strings.Contains(err.Error(), ":17645") {
		t.Errorf("New(non-loopback, no key) = %v, want an error naming APIKey and the address", err)
	}
	_, err = New(Config{ListenAddr: "127.0.0.1:1", AllowedOrigins: []string{"not an origin"}, IdleTimeout: -1})
	for _, want := range []string{"Credentials is required", "Dialer is required", "AllowedOrigins[0]", "IdleTimeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New(bad config) = %v, want it to mention %q", err, want)
		}
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
	w.Write(data)
	w.Close()
	return buf.Bytes()
}

func TestBodyLimitsAndEncodings(t *testing.T) {
	const limit = 64 << 10
	e := newEnv(t, envOptions{mutate: func(c *Config) { c.MaxBodyBytes = limit }})
	small := []byte(messagesBody(false, "#sim reply decoded fine"))
	// A body that fits compressed but not decompressed.
	bomb := []byte(messagesBody(false, strings.Repeat("a", 2*limit)))
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
				t.Fatalf("status %d, want %d: %.300s", resp.StatusCode, tt.wantStatus, readAll(t, resp))
			}
			if tt.wantStatus == 200 {
				var msg struct{ Content []struct{ Text string } }
				json.Unmarshal(readAll(t, resp), &msg)
				if len(msg.Content) != 1 || msg.Content[0].Text != "decoded fine" {
					t.Errorf("content = %+v, want \"decoded fine\"", msg.Content)
				}
				return
			}
			eb := readError(t, resp)
			if eb.Error.Type != tt.wantType || !strings.Contains(eb.Error.Message, tt.wantMsg) {
				t.Errorf("error = %+v, want type %s mentioning %q", eb.Error, tt.wantType, tt.wantMsg)
			}
		})
	}
}

func TestRoutes(t *testing.T) {
	e := newEnv(t, envOptions{})
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		wantBody   string // substring
	}{
		{"HEAD /", "HEAD", "/", "", 200, ""},
		{"HEAD /api/hello", "HEAD", "/api/hello", "", 200, ""},
		{"HEAD anything", "HEAD", "/whatever/else", "", 200, ""},
		{"healthz", "GET", "/healthz", "", 200, `{"ok":true}`},
		{"unknown path", "GET", "/v2/nothing", "", 404, `"message":"Unknown endpoint: GET /v2/nothing"`},
		{"wrong method", "GET", "/v1/messages", "", 404, `Unknown endpoint: GET /v1/messages`},
		{"prefix is not a match", "POST", "/v1/messages/extra", `{}`, 404, `Unknown endpoint: POST /v1/messages/extra`},
		{"unknown model", "GET", "/v1/models/nope-1", "", 404, `"type":"not_found_error","message":"Model 'nope-1' not found"`},
		{"count tokens", "POST", "/v1/messages/count_tokens?beta=true", `{"model":"m","messages":[{"role":"user","content":"abcdefgh"}]}`, 200, `{"input_tokens":`},
		{"count tokens bad body", "POST", "/v1/messages/count_tokens", `[1,2]`, 400, `invalid_request_error`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			req, _ := http.NewRequestWithContext(t.Context(), tt.method, e.url+tt.path, body)
			req.Header.Set("Content-Type", "application/json")
			resp, err := e.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got := string(readAll(t, resp))
			if resp.StatusCode != tt.wantStatus || !strings.Contains(got, tt.wantBody) {
				t.Errorf("%s %s = %d %q, want %d containing %q", tt.method, tt.path, resp.StatusCode, got, tt.wantStatus, tt.wantBody)
			}
			if tt.method == "HEAD" && got != "" {
				t.Errorf("HEAD body = %q, want empty", got)
			}
		})
	}
}

func TestCountTokensValue(t *testing.T) {
	e := newEnv(t, envOptions{})
	// Spec 8.4: without model, the body {"messages":[{"role":"user","content":"abcdefgh"}]}
	// is 50 bytes -> ceil(50/4) = 13.
	resp := e.post(t, "/v1/messages/count_tokens", `{"model":"gpt-5.5","max_tokens":5,"messages":[{"role":"user","content":"abcdefgh"}]}`, nil)
	if got := resp.Header.Get("X-Relay-Token-Count-Source"); got != "local-estimate" {
		t.Errorf("x-relay-token-count-source = %q, want local-estimate", got)
	}
	if got := string(readAll(t, resp)); got != `{"input_tokens":13}` {
		t.Errorf("count_tokens = %s, want {\"input_tokens\":13}", got)
	}
}

func TestModelsList(t *testing.T) {
	e := newEnv(t, envOptions{})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, e.url+"/v1/models?limit=1000", nil)
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var page struct {
		Data []struct {
			Type           string `json:"type"`
			ID             string `json:"id"`
			DisplayName    string `json:"display_name"`
			CreatedAt      string `json:"created_at"`
			ContextWindow  int    `json:"context_window"`
			MaxInputTokens int    `json:"max_input_tokens"`
		} `json:"data"`
		HasMore *bool   `json:"has_more"`
		FirstID *string `json:"first_id"`
		LastID  *string `json:"last_id"`
	}
	if err := json.Unmarshal(readAll(t, resp), &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Data) == 0 || page.HasMore == nil || *page.HasMore || page.FirstID == nil || page.LastID == nil {
		t.Fatalf("page = %+v, want data, has_more false, first_id and last_id", page)
	}
	if *page.FirstID != page.Data[0].ID || *page.LastID != page.Data[len(page.Data)-1].ID {
		t.Errorf("first_id/last_id = %s/%s, want the first and last data ids", *page.FirstID, *page.LastID)
	}
	var found bool
	for _, m := range page.Data {
		if m.Type != "model" || m.CreatedAt != "2025-01-01T00:00:00Z" || m.DisplayName == "" || m.ContextWindow != m.MaxInputTokens {
			t.Errorf("entry %+v lacks the Anthropic shape", m)
		}
		if m.ID == "gpt-5.5" {
			found = true
			if m.ContextWindow != 258400 {
				t.Errorf("gpt-5.5 context_window = %d, want 258400 (95%% of 272000)", m.ContextWindow)
			}
		}
	}
	if !found {
		t.Errorf("models list lacks gpt-5.5: %+v", page.Data)
	}
	req, _ = http.NewRequestWithContext(t.Context(), http.MethodGet, e.url+"/v1/models/gpt-5.5", nil)
	resp, err = e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(readAll(t, resp)); resp.StatusCode != 200 || !strings.Contains(got, `"id":"gpt-5.5"`) || !strings.Contains(got, `"context_window":258400`) {
		t.Errorf("GET /v1/models/gpt-5.5 = %d %s", resp.StatusCode, got)
	}
}

func TestBadRequestNamesField(t *testing.T) {
	e := newEnv(t, envOptions{})
	tests := []struct {
		name string
		body string
		want string
	}{
		{"not json", `{"model":`, "JSON"},
		{"model wrong type", `{"model":5,"max_tokens":10,"messages":[{"role":"user","content":"x"}]}`, "model"},
		{"missing messages", `{"model":"gpt-5.5","max_tokens":10}`, "messages"},
		{"missing max_tokens", `{"model":"gpt-5.5","messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{"bad role", `{"model":"gpt-5.5","max_tokens":10,"messages":[{"role":"robot","content":"x"}]}`, "messages[0].role"},
		{"content wrong type", `{"model":"gpt-5.5","max_tokens":10,"messages":[{"role":"user","content":5}]}`, "messages[0].content"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := e.post(t, "/v1/messages", tt.body, nil)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", resp.StatusCode)
			}
			eb := readError(t, resp)
			if eb.Error.Type != "invalid_request_error" || !strings.Contains(eb.Error.Message, tt.want) {
				t.Errorf("error = %+v, want invalid_request_error naming %q", eb.Error, tt.want)
			}
		})
	}
	// One bad request never disturbs another.
	resp := e.post(t, "/v1/messages", messagesBody(false, "#sim reply still fine"), nil)
	if resp.StatusCode != 200 {
		t.Errorf("good request after bad ones: status %d", resp.StatusCode)
	}
	readAll(t, resp)
	if st := e.sim.Stats(); st.Upgrades != 1 {
		t.Errorf("sim upgrades = %d, want 1 (bad requests must not dial)", st.Upgrades)
	}
}
