package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/clodex/clodex/dataplane/gateway"
)

// Structured outputs reach the backend as text.format and come back as the JSON text the
// client asked for; a schema the backend's strict mode cannot take is answered 400 before
// any socket, naming the keyword.
func TestStructuredOutputs(t *testing.T) {
	e := newEnv(t, envOptions{})
	const schema = `{"type":"object","properties":{"city":{"type":"string"},"population":{"type":"integer"}},"required":["city"],"additionalProperties":false}`
	for _, field := range []string{`"output_config":{"format":{"type":"json_schema","schema":` + schema + `}}`, `"output_format":{"type":"json_schema","schema":` + schema + `}`} {
		body := `{"model":"claude-sonnet-4-5","max_tokens":256,` + field + `,"messages":[{"role":"user","content":"Which city?\n#sim reply not JSON"}]}`
		resp := e.post(t, "/v1/messages", body, nil)
		b := gateway.ReadAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", field, resp.StatusCode, b)
		}
		var msg struct {
			Content []struct{ Type, Text string }
		}
		if err := json.Unmarshal(b, &msg); err != nil || len(msg.Content) != 1 || msg.Content[0].Type != "text" {
			t.Fatalf("%s: answer %s (%v), want one text block", field, b, err)
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(msg.Content[0].Text), &obj); err != nil || obj["city"] != "clodex-sim" || obj["population"] != 0.0 {
			t.Errorf("%s: text %q, want the JSON object {city, population}", field, msg.Content[0].Text)
		}
	}
	socks := e.sim.Sockets()
	want := `"text":{"format":{"type":"json_schema","name":"structured_output","schema":{"type":"object","properties":{"city":{"type":"string"},"population":{"type":"integer"}},"required":["city","population"],"additionalProperties":false},"strict":true}}`
	for i, s := range socks {
		for _, f := range s.Sent() {
			if !strings.Contains(string(f), want) {
				t.Errorf("socket %d frame %s\nlacks %s", i, f, want)
			}
		}
	}

	upgrades := e.sim.Stats().Upgrades
	body := `{"model":"claude-sonnet-4-5","max_tokens":256,"output_config":{"format":{"type":"json_schema","schema":{"type":"object","properties":{"city":{"type":"string","minLength":2}}}}},"messages":[{"role":"user","content":"hi"}]}`
	resp := e.post(t, "/v1/messages", body, nil)
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400: %s", resp.StatusCode, gateway.ReadAll(t, resp))
	}
	const msg = `output_config.format.schema.properties.city.minLength: keyword "minLength" is not supported by the OpenAI backend's strict structured outputs; supported: `
	if eb := gateway.ReadError(t, resp); eb.Error.Type != "invalid_request_error" || !strings.HasPrefix(eb.Error.Message, msg) {
		t.Errorf("error %+v, want invalid_request_error %q…", eb.Error, msg)
	}
	if got := e.sim.Stats().Upgrades; got != upgrades {
		t.Errorf("upgrades went from %d to %d: a refused schema must not reach a socket", upgrades, got)
	}
}
