package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/internal/node"
)

func TestListenerSecurityLoopback(t *testing.T) {
	e := newEnv(t, envOptions{mutate: func(c *node.Config) { c.AllowedOrigins = []string{"http://localhost:3000"} }})
	okBody := gateway.MessagesBody(false, "#sim reply fine")
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
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantStatus, gateway.ReadAll(t, resp))
			}
			if tt.wantStatus == 200 {
				gateway.ReadAll(t, resp)
				return
			}
			eb := gateway.ReadError(t, resp)
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
		{"healthz", "GET", "/healthz", "", 200, `{"ok":true,"service":"clodex-dataplane"}`},
		{"unknown path", "GET", "/v2/nothing", "", 404, `"message":"Unknown endpoint: GET /v2/nothing"`},
		{"wrong method", "GET", "/v1/messages", "", 404, `Unknown endpoint: GET /v1/messages`},
		{"prefix is not a match", "POST", "/v1/messages/extra", `{}`, 404, `Unknown endpoint: POST /v1/messages/extra`},
		{"unknown model", "GET", "/v1/models/nope-1", "", 404, `"type":"not_found_error","message":"Model 'nope-1' not found; GET /v1/models lists the accepted models"`},
		{"count tokens", "POST", "/v1/messages/count_tokens?beta=true", `{"model":"gpt-5.5","messages":[{"role":"user","content":"abcdefgh"}]}`, 200, `{"input_tokens":`},
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
			got := string(gateway.ReadAll(t, resp))
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
	// docs/translation.md §10: without model, the body {"messages":[{"role":"user","content":"abcdefgh"}]}
	// is 50 bytes -> ceil(50/4) = 13.
	resp := e.post(t, "/v1/messages/count_tokens", `{"model":"gpt-5.5","max_tokens":5,"messages":[{"role":"user","content":"abcdefgh"}]}`, nil)
	if got := resp.Header.Get("X-Relay-Token-Count-Source"); got != "local-estimate" {
		t.Errorf("x-relay-token-count-source = %q, want local-estimate", got)
	}
	if got := string(gateway.ReadAll(t, resp)); got != `{"input_tokens":13}` {
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
	if err := json.Unmarshal(gateway.ReadAll(t, resp), &page); err != nil {
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
	if got := string(gateway.ReadAll(t, resp)); resp.StatusCode != 200 || !strings.Contains(got, `"id":"gpt-5.5"`) || !strings.Contains(got, `"context_window":258400`) {
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
			eb := gateway.ReadError(t, resp)
			if eb.Error.Type != "invalid_request_error" || !strings.Contains(eb.Error.Message, tt.want) {
				t.Errorf("error = %+v, want invalid_request_error naming %q", eb.Error, tt.want)
			}
		})
	}
	// One bad request never disturbs another.
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply still fine"), nil)
	if resp.StatusCode != 200 {
		t.Errorf("good request after bad ones: status %d", resp.StatusCode)
	}
	gateway.ReadAll(t, resp)
	if st := e.sim.Stats(); st.Upgrades != 1 {
		t.Errorf("sim upgrades = %d, want 1 (bad requests must not dial)", st.Upgrades)
	}
}
