package gateway_test

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node"
)

// retryAfter reads a retry-after header as whole seconds, failing t when
// it is missing.
func retryAfter(t *testing.T, resp *http.Response) int {
	t.Helper()
	n, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil {
		t.Fatalf("retry-after %q, want whole seconds", resp.Header.Get("Retry-After"))
	}
	return n
}

// A request the upstream would certainly reject gets an immediate 400
// naming the field, before any socket: the emulator sees no upgrade.
func TestRejectedBeforeAnySocket(t *testing.T) {
	e := newEnv(t, envOptions{})
	msgs := func(m string) string { return `{"model":"claude-sonnet-4-5","max_tokens":64,"messages":` + m + `}` }
	user := func(blocks string) string { return msgs(`[{"role":"user","content":[` + blocks + `]}]`) }
	tests := []struct {
		name, body, want string
	}{
		{"empty messages", msgs(`[]`), "messages: must contain at least one message"},
		{"empty content", msgs(`[{"role":"user","content":[]}]`), "messages[0].content: must contain at least one content block"},
		{"a block type it cannot carry", user(`{"type":"container_upload","file_id":"f"}`), `messages[0].content[0].type: content block type "container_upload" cannot be sent`},
		{"a bmp image", user(`{"type":"image","source":{"type":"base64","media_type":"image/bmp","data":"Qk0="}}`),
			"messages[0].content[0].source.media_type: image media type \"image/bmp\" cannot be sent to the OpenAI backend; allowed: image/png, image/jpeg, image/gif, image/webp"},
		{"an image without data", user(`{"type":"image","source":{"type":"base64","media_type":"image/png"}}`), "messages[0].content[0].source.data: field required"},
		{"a PDF with no data", user(`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":""}}`), "messages[0].content[0].source.data: must not be empty"},
		{"a file document", user(`{"type":"document","source":{"type":"file","file_id":"f"}}`), "messages[0].content[0].source.type"},
		{"an unknown model", `{"model":"gpt-4o","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`, `model: model "gpt-4o" is not served here; accepted: claude-opus-*`},
	}
	for _, tt := range tests {
		for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
			resp := e.post(t, path, tt.body, nil)
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("%s %s: status %d, want 400: %s", tt.name, path, resp.StatusCode, gateway.ReadAll(t, resp))
				continue
			}
			if eb := gateway.ReadError(t, resp); eb.Error.Type != "invalid_request_error" || !strings.Contains(eb.Error.Message, tt.want) {
				t.Errorf("%s %s: error %+v, want invalid_request_error containing %q", tt.name, path, eb.Error, tt.want)
			}
		}
	}
	if st := e.sim.Stats(); st.Upgrades != 0 || st.Responses != 0 {
		t.Errorf("sim upgrades=%d responses=%d, want 0 and 0: nothing was dialed", st.Upgrades, st.Responses)
	}
}

// Documents go upstream as input_file and input_text parts, at the top
// level and inside a tool result, and cost what they carry.
func TestDocumentsReachTheUpstream(t *testing.T) {
	e := newEnv(t, envOptions{})
	pdf := "JVBERi0xLjQKMSAwIG9iago8PCAvVHlwZSAvUGFnZSA+PgplbmRvYmoKJSVFT0YK" // a tiny PDF
	body := func(content string) string {
		return `{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":[` + content + `]}]}`
	}
	text := `{"type":"text","text":"#sim reply read"}`
	doc := `{"type":"document","title":"spec","source":{"type":"base64","media_type":"application/pdf","data":"` + pdf + `"}}`
	url := `{"type":"document","source":{"type":"url","url":"https://example.com/a.pdf"}}`
	plain := `{"type":"document","source":{"type":"text","media_type":"text/plain","data":"plain words"}}`
	inTool := `{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"read a PDF"},` + doc + `]}`
	var tokens []int64
	for _, content := range []string{text, doc + "," + url + "," + plain + "," + text, inTool + "," + text} {
		before := e.sim.Stats().InputTokens
		resp := e.post(t, "/v1/messages", body(content), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200: %s", resp.StatusCode, gateway.ReadAll(t, resp))
		}
		gateway.ReadAll(t, resp)
		tokens = append(tokens, e.sim.Stats().InputTokens-before)
	}
	var sent []string
	for _, s := range e.sim.Sockets() {
		for _, f := range s.Sent() {
			sent = append(sent, string(f))
		}
	}
	if len(sent) != 3 {
		t.Fatalf("the sim got %d response.create frames, want 3", len(sent))
	}
	for i, want := range [][]string{
		{`{"type":"input_text","text":"#sim reply read"}`},
		{`{"type":"input_text","text":"Document title: spec"}`, `{"type":"input_file","file_data":"data:application/pdf;base64,` + pdf + `","filename":"spec.pdf"}`,
			`{"type":"input_file","file_url":"https://example.com/a.pdf"}`, `{"type":"input_text","text":"plain words"}`},
		{`"output":"[{\"type\":\"text\",\"text\":\"read a PDF\"},{\"type\":\"document\",\"note\":\"attached to the next user message as document 1 of tool call toolu_1\"}]"`,
			`{"type":"input_text","text":"The following document is document 1 of tool call toolu_1:"}`, `"filename":"spec.pdf"`},
	} {
		for _, w := range want {
			if !strings.Contains(sent[i], reorder(t, w)) && !strings.Contains(sent[i], w) {
				t.Errorf("frame %d lacks %s:\n%s", i, w, sent[i])
			}
		}
	}
	// The PDF's base64 never travels as text.
	if strings.Contains(sent[2], `\"data\":\"`+pdf) {
		t.Errorf("the PDF went upstream as text inside the tool output:\n%s", sent[2])
	}
	// Each document costs input tokens: nothing was dropped.
	if !(tokens[1] > tokens[0]+len64(pdf)/4 && tokens[2] > tokens[0]+len64(pdf)/4) {
		t.Errorf("input tokens %v: the requests with documents must cost at least the PDF's %d tokens more", tokens, len64(pdf)/4)
	}
}

func len64(s string) int64 { return int64(len(s)) }

// reorder writes a JSON object with its keys sorted, as the data plane
// sends items.
func reorder(t *testing.T, obj string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(obj), &v); err != nil {
		return obj
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// A persistent upstream failure costs one short retry, not the whole
// ladder: the first request retries once after 2 s, the next one (the
// upstream is now failing) makes one attempt; both answers carry
// retry-after and x-should-retry and say when to retry.
func TestPersistentFailureIsHandedToTheClient(t *testing.T) {
	tests := []struct {
		code       string
		wantStatus int
		wantType   string
	}{
		{"server_error", http.StatusBadGateway, "api_error"},
		{"server_is_overloaded", 529, "overloaded_error"},
		{"rate_limit_exceeded", http.StatusTooManyRequests, "rate_limit_error"},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			e := newEnv(t, envOptions{sim: codexsim.Config{Faults: codexsim.Faults{FailResponses: tt.code}},
				mutate: func(c *node.Config) { c.RetryRand = func() float64 { return 0 } }}) // no jitter
			for i, wantAttempts := range []int64{2, 1} {
				before := e.sim.Stats().Errors[tt.code]
				resp := e.post(t, "/v1/messages", gateway.MessagesBody(i == 0, "hi"), nil)
				if resp.StatusCode != tt.wantStatus {
					t.Fatalf("request %d: status %d, want %d: %s", i, resp.StatusCode, tt.wantStatus, gateway.ReadAll(t, resp))
				}
				if v := resp.Header.Get("X-Should-Retry"); v != "true" {
					t.Errorf("request %d: x-should-retry %q, want true", i, v)
				}
				ra := retryAfter(t, resp)
				eb := gateway.ReadError(t, resp)
				if eb.Error.Type != tt.wantType || !strings.HasSuffix(eb.Error.Message, "; retry after "+strconv.Itoa(ra)+"s") || !strings.Contains(eb.Error.Message, tt.code) {
					t.Errorf("request %d: error %+v, want %s naming %s and ending with the retry-after %ds", i, eb.Error, tt.wantType, tt.code, ra)
				}
				// The upstream has failed for 2 s: its next try is due in max(2 s / 4, 1 s);
				// the header is drawn from [1, 2].
				if ra < 1 || ra > 2 {
					t.Errorf("request %d: retry-after %d, want 1 or 2", i, ra)
				}
				if got := e.sim.Stats().Errors[tt.code] - before; got != wantAttempts {
					t.Errorf("request %d: %d attempts upstream, want %d", i, got, wantAttempts)
				}
			}
			if got := e.clock.Sleeps(); len(got) != 1 || got[0] != 2*time.Second {
				t.Errorf("waits %v, want one 2 s wait (the first request's retry)", got)
			}
			// Once the upstream answers again, the next turn succeeds and heals it.
			if err := e.sim.SetConfig(codexsim.ConfigPatch{FailResponses: ptr("")}); err != nil {
				t.Fatal(err)
			}
			resp := e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply back"), nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("after the fault: status %d, want 200: %s", resp.StatusCode, gateway.ReadAll(t, resp))
			}
			gateway.ReadAll(t, resp)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// An unreachable upstream is named with the cause; while it stays down,
// the next request is answered at once without a dial until the probe is
// due.
func TestUnreachableUpstreamNamesHostAndCause(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: connection refused
	e := newEnv(t, envOptions{mutate: func(c *node.Config) {
		c.UpstreamURL = "ws://" + addr + "/backend-api/codex/responses"
		c.RetryRand = func() float64 { return 0 } // retry-after is the wait itself
		c.AdminListen = "127.0.0.1:0"             // /metrics: the embedded control plane's decisions
	}})
	want := "The upstream " + addr + " cannot be reached: connection refused"
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(true, "hi"), nil)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Should-Retry") != "true" {
		t.Fatalf("status %d x-should-retry %q, want 502 and true", resp.StatusCode, resp.Header.Get("X-Should-Retry"))
	}
	ra := retryAfter(t, resp)
	if eb := gateway.ReadError(t, resp); eb.Error.Type != "api_error" || eb.Error.Message != want+"; retry after "+strconv.Itoa(ra)+"s" {
		t.Errorf("error %+v, want api_error %q", eb.Error, want+"; retry after Ns")
	}
	// One retry (2 s) inside the data plane; the upstream is then failing,
	// its probe due 1 s after the second failure. Half a second later the
	// next request is not dialed.
	e.clock.Advance(500 * time.Millisecond)
	resp = e.post(t, "/v1/messages", gateway.MessagesBody(false, "hi"), nil)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("second request: status %d, want 502", resp.StatusCode)
	}
	if eb := gateway.ReadError(t, resp); !strings.HasPrefix(eb.Error.Message, want+" (failing for 3s; not tried again yet); retry after 1s") {
		t.Errorf("second request: error %q, want it to say the upstream was not tried again", eb.Error.Message)
	}
	if got := e.clock.Sleeps(); len(got) != 1 {
		t.Errorf("waits %v, want only the first request's retry", got)
	}
	// Only the two dials asked for admission: the request answered without
	// a dial spent none of the account's bucket.
	if got := admissions(t, e.dp.AdminAddr()); got != 2 {
		t.Errorf("admissions by the control plane = %d, want 2 (the first request's two dials)", got)
	}
}

// admissions sums clodex_controlplane_admissions_total (every decision
// kind) on the data plane's admin listener at addr.
func admissions(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body := gateway.ReadAll(t, resp)
	sum := 0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "clodex_controlplane_admissions_total{") {
			continue
		}
		f := strings.Fields(line)
		n, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		sum += int(n)
	}
	return sum
}

// An upgrade answered 5xx names the upstream, on the attempt that met it
// and on the answers given without a dial while it stays down.
func TestUpgrade5xxNamesTheUpstream(t *testing.T) {
	e := newEnv(t, envOptions{sim: codexsim.Config{Faults: codexsim.Faults{Upgrade5xxShare: 1, Upgrade5xxStatus: 503}},
		mutate: func(c *node.Config) { c.RetryRand = func() float64 { return 0 } }})
	host := strings.TrimPrefix(e.sim.URL, "http://")
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(false, "hi"), nil)
	if eb := gateway.ReadError(t, resp); resp.StatusCode != 529 || eb.Error.Message != "Upstream "+host+": WebSocket upgrade failed (HTTP 503); retry after 1s" {
		t.Errorf("first answer %d %q, want 529 naming the upstream", resp.StatusCode, eb.Error.Message)
	}
	resp = e.post(t, "/v1/messages", gateway.MessagesBody(false, "hi"), nil)
	if eb := gateway.ReadError(t, resp); resp.StatusCode != 529 ||
		!strings.HasPrefix(eb.Error.Message, "Upstream "+host+": WebSocket upgrade failed (HTTP 503) (failing for 2s; not tried again yet); retry after ") {
		t.Errorf("second answer %d %q, want 529 naming the upstream, not tried again", resp.StatusCode, eb.Error.Message)
	}
	if n := e.sim.Stats().Upgrade5xxs; n != 2 {
		t.Errorf("the emulator answered %d upgrades 503, want 2 (the first request and its retry)", n)
	}
}

// Usage limits from the emulator: a far reset is final and says when (in
// its message and the anthropic-ratelimit-*-reset headers, with no
// retry-after); a near one is a 429 whose retry-after is the reset. Neither
// is retried inside the data plane.
func TestUsageLimitFromTheEmulator(t *testing.T) {
	e := newEnv(t, envOptions{mutate: func(c *node.Config) { c.RetryRand = func() float64 { return 0 } }})
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(true, "#sim usage-limit 9000 pro"), nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-Should-Retry") != "false" || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("far reset: status %d x-should-retry %q retry-after %q, want 429, false and none", resp.StatusCode,
			resp.Header.Get("X-Should-Retry"), resp.Header.Get("Retry-After"))
	}
	reset := resp.Header.Get("anthropic-ratelimit-requests-reset")
	if _, err := time.Parse(time.RFC3339, reset); err != nil || resp.Header.Get("anthropic-ratelimit-tokens-reset") != reset {
		t.Errorf("far reset: requests-reset %q, tokens-reset %q; want the same RFC 3339 time", reset, resp.Header.Get("anthropic-ratelimit-tokens-reset"))
	}
	far := "The ChatGPT plan's usage limit was reached (usage_limit_reached, pro plan); it resets in 2h30m (at " + reset + "); retrying before then will not help"
	if eb := gateway.ReadError(t, resp); eb.Error.Message != far {
		t.Errorf("far reset: message %q, want %q", eb.Error.Message, far)
	}
	resp = e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim usage-limit 20"), nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-Should-Retry") != "true" || resp.Header.Get("Retry-After") != "20" {
		t.Fatalf("near reset: status %d x-should-retry %q retry-after %q, want 429, true, 20", resp.StatusCode,
			resp.Header.Get("X-Should-Retry"), resp.Header.Get("Retry-After"))
	}
	gateway.ReadAll(t, resp)
	if n := e.sim.Stats().Errors["usage_limit_reached"]; n != 2 {
		t.Errorf("the sim answered %d usage limits, want 2: none was retried", n)
	}
	if got := e.clock.Sleeps(); len(got) != 0 {
		t.Errorf("waits %v, want none", got)
	}
}

// Operators see every failed turn: a WARN line with its cause, an SSE
// error after a 200 included, and the metrics count failed turns and
// pacer refusals.
func TestFailedTurnsAreVisible(t *testing.T) {
	e := newEnv(t, envOptions{sim: codexsim.Config{Faults: codexsim.Faults{CloseAfterEvents: 8}},
		mutate: func(c *node.Config) { c.AdminListen = "127.0.0.1:0" }})
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(true, "#sim reply "+strings.Repeat("word ", 50)), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200 then an SSE error", resp.StatusCode)
	}
	if body := string(gateway.ReadAll(t, resp)); !strings.Contains(body, "event: error") {
		t.Fatalf("no SSE error event:\n%s", body)
	}
	logs := e.dp.Logs.String()
	var line string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "msg=request") && strings.Contains(l, "path=/v1/messages") {
			line = l
		}
	}
	for _, want := range []string{"level=WARN", "status=200", "outcome=failed", "attempts=1", `err="read upstream:`} {
		if !strings.Contains(line, want) {
			t.Errorf("request log line %q lacks %q", line, want)
		}
	}
	resp, err := e.client.Get("http://" + e.dp.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if m := string(gateway.ReadAll(t, resp)); !strings.Contains(m, `clodex_dataplane_failed_turns_total{status="stream"} 1`) {
		t.Errorf("/metrics lacks the failed turn:\n%s", m)
	}
}

// The models the data plane accepts are listed with the upstream model
// each maps to, and each answers on its own.
func TestModelsListing(t *testing.T) {
	e := newEnv(t, envOptions{})
	get := func(path string) (int, map[string]any) {
		t.Helper()
		resp, err := e.client.Get(e.url + path)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal(gateway.ReadAll(t, resp), &v); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, v
	}
	_, list := get("/v1/models")
	found := map[string]string{}
	for _, m := range list["data"].([]any) {
		m := m.(map[string]any)
		found[m["id"].(string)] = m["upstream_model"].(string)
	}
	for id, up := range map[string]string{"claude-sonnet-4-5": "gpt-5.5", "claude-opus-5-5": "gpt-5.5", "claude-haiku-4-5": "gpt-5.4-mini", "gpt-5.5": "gpt-5.5"} {
		if found[id] != up {
			t.Errorf("/v1/models: %s maps to %q, want %q", id, found[id], up)
		}
	}
	for _, id := range []string{"claude-sonnet-4-5", "claude-opus-4-1-20250805", "claude-sonnet-7-0"} {
		status, m := get("/v1/models/" + id)
		if status != http.StatusOK || m["id"] != id || m["upstream_model"] != "gpt-5.5" || m["type"] != "model" {
			t.Errorf("GET /v1/models/%s = %d %v, want 200 mapping to gpt-5.5", id, status, m)
		}
	}
	if status, _ := get("/v1/models/gpt-4o"); status != http.StatusNotFound {
		t.Errorf("GET /v1/models/gpt-4o = %d, want 404", status)
	}
}

// With --model-passthrough an unknown name reaches the backend unchanged.
func TestModelPassthrough(t *testing.T) {
	e := newEnv(t, envOptions{mutate: func(c *node.Config) { c.ModelPassthrough = true }})
	resp := e.post(t, "/v1/messages", `{"model":"gpt-4o","max_tokens":64,"messages":[{"role":"user","content":"#sim reply ok"}]}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", resp.StatusCode, gateway.ReadAll(t, resp))
	}
	gateway.ReadAll(t, resp)
	if sent := e.sim.Sockets()[0].Sent(); len(sent) != 1 || !strings.Contains(string(sent[0]), `"model":"gpt-4o"`) {
		t.Errorf("frames %q, want one response.create for gpt-4o", sent)
	}
}

// A failure after message_start but before any content is retried inside
// the request budget: the client saw nothing it must undo, and the retry
// continues the same message.
func TestRetryAfterMessageStartBeforeContent(t *testing.T) {
	up := newWSUpstream(t, func(n int) []string {
		if n == 1 {
			return []string{
				`{"type":"response.created","response":{"id":"resp_1"}}`,
				`{"type":"response.output_item.added","output_index":0,"item":{"type":"reasoning","id":"rs_1","summary":[]}}`,
				`{"type":"response.failed","response":{"id":"resp_1","error":{"code":"server_error","message":"x"}}}`,
			}
		}
		return []string{
			`{"type":"response.created","response":{"id":"resp_2"}}`,
			`{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"m","role":"assistant","content":[]}}`,
			`{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"recovered"}`,
			`{"type":"response.output_item.done","output_index":0,"item":{"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"recovered"}]}}`,
			`{"type":"response.completed","response":{"id":"resp_2","usage":{"input_tokens":5,"output_tokens":1}}}`,
		}
	})
	e := newEnv(t, envOptions{mutate: func(c *node.Config) { c.UpstreamURL = up.url }})
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(true, "hi"), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", resp.StatusCode, gateway.ReadAll(t, resp))
	}
	body := string(gateway.ReadAll(t, resp))
	for _, want := range []string{
		`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"recovered"}}`,
		"event: message_stop",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("body lacks %s:\n%s", want, body)
		}
	}
	// The failed attempt's reasoning item had no text yet: it left no
	// (unsigned) thinking block behind.
	if strings.Contains(body, `"thinking"`) {
		t.Errorf("body has a thinking block of the failed attempt:\n%s", body)
	}
	if n := strings.Count(body, "event: message_start"); n != 1 || strings.Contains(body, "event: error") {
		t.Errorf("body has %d message_start events (want 1) or an error event:\n%s", n, body)
	}
	if creates, _ := up.stats(); creates != 2 {
		t.Errorf("upstream got %d response.create, want 2 (the retry)", creates)
	}
}
