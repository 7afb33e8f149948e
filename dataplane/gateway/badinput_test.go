package gateway_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/gateway"
)

// TestBadInputNamesTheField: what encoding/json or the upstream would
// take silently (or refuse only after a socket was spent) gets a 400 from
// the data plane itself, naming the field. The emulator sees no request.
func TestBadInputNamesTheField(t *testing.T) {
	e := newEnv(t, envOptions{})
	const head = `{"model":"gpt-5.5","max_tokens":10,"messages":`
	img := func(data string) string {
		return head + `[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + data + `"}}]}]}`
	}
	tests := []struct {
		name, path, body, want string
	}{
		{"invalid UTF-8 in a text", "/v1/messages", head + "[{\"role\":\"user\",\"content\":\"hi \xff\xfe there\"}]}",
			"messages[0].content: is not valid UTF-8 (byte 0xff at offset 76 of the body)"},
		{"invalid UTF-8 in count_tokens", "/v1/messages/count_tokens", head + "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\xc3\"}]}]}",
			"messages[0].content[0].text: is not valid UTF-8"},
		{"orphan tool_result", "/v1/messages", head + `[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"ok"}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_nope","content":"x"}]}]}`,
			`messages[2].content[0].tool_use_id: "toolu_nope" matches no tool_use block of the assistant message before it (messages[1])`},
		{"image data not base64", "/v1/messages", img("!!!!"), "messages[0].content[0].source.data: is not valid base64"},
		{"image base64 with stray bits", "/v1/messages", img("iVBORw0KGgp="), "messages[0].content[0].source.data: is not valid base64"},
		{"PDF data not base64", "/v1/messages", head + `[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0xLjQK\n"}}]}]}`,
			"messages[0].content[0].source.data: is not valid base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := e.post(t, tt.path, tt.body, nil)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", resp.StatusCode, gateway.ReadAll(t, resp))
			}
			eb := gateway.ReadError(t, resp)
			if eb.Error.Type != "invalid_request_error" || !strings.HasPrefix(eb.Error.Message, tt.want) {
				t.Errorf("error = %+v, want invalid_request_error starting %q", eb.Error, tt.want)
			}
		})
	}
	if st := e.sim.Stats(); st.Upgrades != 0 {
		t.Errorf("the emulator saw %d upgrades; refused requests must not reach it", st.Upgrades)
	}
}

// TestHeaderTooLarge: a 2 MB header gets 431 with an Anthropic error body
// (net/http alone answers plain text), over the data plane's own listener.
func TestHeaderTooLarge(t *testing.T) {
	e := newEnv(t, envOptions{})
	c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // a bound, not an assertion
	body := gateway.MessagesBody(false, "hi")
	go func() {
		// The server answers before it has read all of this; the rest
		// may fail to send once it closes.
		_, _ = io.WriteString(c, "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Big: "+
			strings.Repeat("a", 2<<20)+"\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, Content-Type %q; want 431 application/json", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var eb gateway.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
		t.Fatalf("body is not JSON: %v", err)
	}
	if eb.Type != "error" || eb.Error.Type != "request_too_large" || !strings.Contains(eb.Error.Message, "Request headers exceed the 1048576 byte limit") {
		t.Errorf("error = %+v, want request_too_large naming the limit", eb)
	}
	// A request under the limit on a new connection is served.
	resp2 := e.post(t, "/v1/messages", body, map[string]string{"X-Big": strings.Repeat("a", 512<<10)})
	if resp2.StatusCode != http.StatusOK {
		t.Errorf("status %d with a 512 KiB header, want 200: %s", resp2.StatusCode, gateway.ReadAll(t, resp2))
	}
	gateway.ReadAll(t, resp2)
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
