package translate

import (
	"errors"
	"strings"
	"testing"
)

func collect(t *testing.T, sse string) *Collector {
	t.Helper()
	c := NewCollector()
	lines := strings.Split(strings.TrimSpace(sse), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		name := strings.TrimPrefix(lines[i], "event: ")
		data := strings.TrimPrefix(lines[i+1], "data: ")
		if err := c.WriteEvent(name, []byte(data)); err != nil {
			t.Fatalf("WriteEvent(%s): %v", name, err)
		}
	}
	return c
}

func TestCollectorSpec16(t *testing.T) {
	msg, err := collect(t, spec16SSE).Message()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"msg_1766000000123","type":"message","role":"assistant","model":"clodex:openai-oauth:gpt-5.6-sol","content":[{"type":"thinking","thinking":"Greeting the user.","signature":"gAAAAB-ENC1"},{"type":"text","text":"Hi!"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":808,"output_tokens":40,"cache_creation_input_tokens":0,"cache_read_input_tokens":8192}}`
	if string(msg) != want {
		t.Errorf("\n got %s\nwant %s", msg, want)
	}
}

func TestCollectorToolUseAndEmptyText(t *testing.T) {
	sse := `event: message_start
data: {"type":"message_start","message":{"id":"msg_2","model":"claude-opus-5-5"}}
event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}
event: content_block_stop
data: {"type":"content_block_stop","index":0}
event: ping
data: {"type":"ping"}
event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"call_1","name":"Bash","input":{}}}
event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"command\": "}}
event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"ls\"}"}}
event: content_block_stop
data: {"type":"content_block_stop","index":1}
event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":1,"output_tokens":2,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}
event: message_stop
data: {"type":"message_stop"}`
	msg, err := collect(t, sse).Message()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"msg_2","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"tool_use","id":"call_1","name":"Bash","input":{"command":"ls"}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":2,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}`
	if string(msg) != want {
		t.Errorf("\n got %s\nwant %s", msg, want)
	}
}

func TestCollectorIncompleteAndError(t *testing.T) {
	c := collect(t, `event: message_start
data: {"type":"message_start","message":{"id":"m","model":"x"}}`)
	if _, err := c.Message(); !errors.Is(err, ErrCollectorIncomplete) {
		t.Errorf("err = %v, want ErrCollectorIncomplete", err)
	}
	if err := c.WriteEvent("error", []byte(`{"type":"error","error":{"type":"api_error","message":"m"}}`)); err != nil {
		t.Fatalf("WriteEvent(error) = %v", err)
	}
	if _, err := c.Message(); err == nil || !strings.Contains(err.Error(), "api_error") {
		t.Errorf("err = %v", err)
	}
	if err := NewCollector().WriteEvent("content_block_delta", []byte(`{"index":3,"delta":{"type":"text_delta"}}`)); err == nil {
		t.Error("delta for an unopened block accepted")
	}
	if err := NewCollector().WriteEvent("message_start", []byte(`{`)); err == nil {
		t.Error("bad JSON accepted")
	}
}

// A max_output_tokens cut is reported as max_tokens in the non-streaming
// message too.
func TestCollectorMaxTokensThroughStream(t *testing.T) {
	c := NewCollector()
	s := NewStream(&Turn{RequestedModel: "claude-opus-5-5"}, c, "msg_3")
	for _, f := range []string{
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"message"}}`,
		`{"type":"response.output_text.delta","output_index":0,"delta":"abc"}`,
		`{"type":"response.incomplete","response":{"incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":3,"output_tokens":9}}}`,
	} {
		if _, err := s.Handle([]byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	msg, err := c.Message()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"msg_3","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"abc"}],"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":9,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}`
	if string(msg) != want {
		t.Errorf("\n got %s\nwant %s", msg, want)
	}
}
