package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/clodex/clodex/dataplane/pool"
)

// FuzzMessages posts arbitrary bodies, encodings and paths: every answer is
// a well-formed Anthropic error (or the upstream's refusal), never a panic
// or an empty 200.
func FuzzMessages(f *testing.F) {
	f.Add([]byte(`{"model":"gpt-5.5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`), "", "/v1/messages")
	f.Add([]byte(`{"model":"gpt-5.5","max_tokens":10,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"tools":[{"name":"a","input_schema":{"type":"object"}}]}`), "", "/v1/messages?beta=true")
	f.Add([]byte(`{"model":5}`), "", "/v1/messages")
	f.Add([]byte(`[]`), "gzip", "/v1/messages/count_tokens")
	f.Add([]byte("\x1f\x8b\x08\x00"), "gzip", "/v1/messages")
	f.Add([]byte(`{}`), "br", "/v1/messages")
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AA"}}]}]}`), "", "/v1/messages/count_tokens")
	p, err := pool.New(pool.Config{Credentials: noUpstream("no upstream in the fuzzer")})
	if err != nil {
		f.Fatal(err)
	}
	defer p.Close()
	srv, err := New(Config{
		Router:       newRouter(f, "tok", "acct"),
		Pool:         p,
		MaxBodyBytes: 1 << 20,
		RetryClock:   NewFakeClock(),
	})
	if err != nil {
		f.Fatal(err)
	}
	defer srv.Close()
	h := srv.Handler()
	f.Fuzz(func(t *testing.T, body []byte, encoding, path string) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n\t#") {
			return
		}
		if _, err := url.ParseRequestURI(path); err != nil {
			return
		}
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:17645"+path, strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		if encoding != "" {
			req.Header.Set("Content-Encoding", encoding)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code == http.StatusOK {
			if !strings.HasPrefix(req.URL.Path, "/v1/messages/count_tokens") {
				t.Fatalf("200 for %s without an upstream: %s", path, rec.Body)
			}
			return
		}
		var eb ErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Type != "error" || eb.Error.Type == "" || eb.Error.Message == "" {
			t.Fatalf("status %d with body %q: not an Anthropic error", rec.Code, rec.Body)
		}
	})
}
