package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/clodex/clodex/dataplane/gateway"
)

// usageOf decodes the usage of the SSE event named name in body.
func usageOf(t *testing.T, body, name string) map[string]int {
	t.Helper()
	var out map[string]int
	for _, ev := range strings.Split(body, "\n\n") {
		data, ok := strings.CutPrefix(ev, "event: "+name+"\ndata: ")
		if !ok {
			continue
		}
		var m struct {
			Usage   map[string]int `json:"usage"`
			Message struct {
				Usage map[string]int `json:"usage"`
			} `json:"message"`
		}
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("%s data %s: %v", name, data, err)
		}
		out = m.Usage
		if name == "message_start" {
			out = m.Message.Usage
		}
	}
	if out == nil {
		t.Fatalf("no %s event in:\n%s", name, body)
	}
	return out
}

// message_start carries the turn's count_tokens estimate; on a continued turn the part the
// socket already holds (the conversation as the backend counted it: the previous turn's
// input plus output) is cache_read_input_tokens. message_delta keeps the backend's figures.
func TestMessageStartCarriesTheEstimate(t *testing.T) {
	e := newEnv(t, envOptions{})
	messages := []any{map[string]any{"role": "user", "content": "#sim reply " + strings.Repeat("first answer ", 40)}}
	system := "Be brief."
	turn := func() (start, delta map[string]int, estimate int, reply string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "gpt-5.5", "max_tokens": 1024, "stream": true, "system": system, "messages": messages})
		resp := e.post(t, "/v1/messages?beta=true", string(body), sessionHeader)
		sse := string(gateway.ReadAll(t, resp))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, sse)
		}
		var text strings.Builder
		for _, ev := range strings.Split(sse, "\n\n") {
			if data, ok := strings.CutPrefix(ev, "event: content_block_delta\ndata: "); ok {
				var d struct{ Delta struct{ Text string } }
				_ = json.Unmarshal([]byte(data), &d)
				text.WriteString(d.Delta.Text)
			}
		}
		ct := e.post(t, "/v1/messages/count_tokens", string(body), nil)
		var n struct {
			InputTokens int `json:"input_tokens"`
		}
		if err := json.Unmarshal(gateway.ReadAll(t, ct), &n); err != nil || ct.StatusCode != http.StatusOK {
			t.Fatalf("count_tokens: %d %v", ct.StatusCode, err)
		}
		return usageOf(t, sse, "message_start"), usageOf(t, sse, "message_delta"), n.InputTokens, text.String()
	}

	start1, delta1, est1, reply := turn()
	if start1["input_tokens"] != est1 || start1["cache_read_input_tokens"] != 0 || start1["output_tokens"] != 0 {
		t.Errorf("turn 1 message_start usage %v, want input_tokens %d (count_tokens), nothing cached, no output", start1, est1)
	}
	if st := e.sim.Stats(); delta1["input_tokens"] != int(st.InputTokens) || delta1["output_tokens"] != int(st.OutputTokens) {
		t.Errorf("turn 1 message_delta usage %v, want the backend's input %d and output %d", delta1, st.InputTokens, st.OutputTokens)
	}
	held := delta1["input_tokens"] + delta1["cache_read_input_tokens"] + delta1["output_tokens"]

	messages = append(messages,
		map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": reply}}},
		map[string]any{"role": "user", "content": "#sim reply second"})
	// A longer system prompt makes this turn's estimate larger than what the socket holds.
	system += strings.Repeat(" Answer in one line.", 100)
	start2, delta2, est2, _ := turn()
	if est2 <= held {
		t.Fatalf("turn 2 estimate %d, want it above the %d tokens held, so both parts of message_start are checked", est2, held)
	}
	if st := e.sim.Stats(); st.ContinuedResponses != 1 {
		t.Fatalf("sim continued %d responses, want 1: the second turn continues the first", st.ContinuedResponses)
	}
	if start2["cache_read_input_tokens"] != held || start2["input_tokens"] != est2-held {
		t.Errorf("turn 2 message_start usage %v, want cache_read_input_tokens %d (what the socket holds) and input_tokens %d (the rest of the estimate %d)",
			start2, held, est2-held, est2)
	}
	if delta2["cache_read_input_tokens"] != held {
		t.Errorf("turn 2 message_delta usage %v, want the backend's cached_tokens %d", delta2, held)
	}
}
