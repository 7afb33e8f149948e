package translate

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/clodex/clodex/dataplane/retry"
)

// recorder is an EventWriter that keeps the SSE text.
type recorder struct {
	events []string
	failAt int // fail the n-th write (1-based); 0 = never
}

func (r *recorder) WriteEvent(name string, data []byte) error {
	if r.failAt > 0 && len(r.events)+1 == r.failAt {
		return errors.New("client gone")
	}
	if !json.Valid(data) {
		return errors.New("invalid JSON data for " + name)
	}
	r.events = append(r.events, "event: "+name+"\ndata: "+string(data)+"\n")
	return nil
}

func (r *recorder) text() string { return strings.Join(r.events, "") }

func runFrames(t *testing.T, turn *Turn, frames []string) (*Stream, *recorder, State) {
	t.Helper()
	rec := &recorder{}
	s := NewStream(turn, rec, "msg_1766000000123")
	state := StateRunning
	for i, f := range frames {
		var err error
		state, err = s.Handle([]byte(f))
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if state != StateRunning && i != len(frames)-1 {
			t.Fatalf("frame %d: state %v before the last frame", i, state)
		}
	}
	return s, rec, state
}

// spec16Frames are the upstream frames of a text turn with a reasoning
// summary.
var spec16Frames = []string{
	`{"type":"response.created","response":{"id":"resp_A1","object":"response","created_at":1766000000,"model":"gpt-5.6-sol","status":"in_progress"},"sequence_number":0}`,
	`{"type":"response.in_progress","response":{"id":"resp_A1","status":"in_progress"},"sequence_number":1}`,
	`{"type":"response.output_item.added","output_index":0,"item":{"type":"reasoning","id":"rs_1","summary":[]},"sequence_number":2}`,
	`{"type":"response.reasoning_summary_part.added","item_id":"rs_1","output_index":0,"summary_index":0,"part":{"type":"summary_text","text":""}}`,
	`{"type":"response.reasoning_summary_text.delta","item_id":"rs_1","output_index":0,"summary_index":0,"delta":"Greeting the user."}`,
	`{"type":"response.reasoning_summary_part.done","item_id":"rs_1","output_index":0,"summary_index":0,"part":{"type":"summary_text","text":"Greeting the user."}}`,
	`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Greeting the user."}],"encrypted_content":"gAAAAB-ENC1"}}`,
	`{"type":"response.output_item.added","output_index":1,"item":{"type":"message","id":"msg_1","role":"assistant","status":"in_progress","content":[]}}`,
	`{"type":"response.output_text.delta","item_id":"msg_1","output_index":1,"content_index":0,"delta":"Hi"}`,
	`{"type":"response.output_text.delta","item_id":"msg_1","output_index":1,"content_index":0,"delta":"!"}`,
	`{"type":"response.output_item.done","output_index":1,"item":{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Hi!","annotations":[]}]}}`,
	`{"type":"response.completed","response":{"id":"resp_A1","status":"completed","usage":{"input_tokens":9000,"input_tokens_details":{"cached_tokens":8192},"output_tokens":40,"output_tokens_details":{"reasoning_tokens":25},"total_tokens":9040}}}`,
}

const spec16SSE = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1766000000123","type":"message","role":"assistant","content":[],"model":"clodex:openai-oauth:gpt-5.6-sol","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":77,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}
event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}
event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Greeting the user."}}
event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"gAAAAB-ENC1"}}
event: content_block_stop
data: {"type":"content_block_stop","index":0}
event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}
event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}
event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"!"}}
event: content_block_stop
data: {"type":"content_block_stop","index":1}
event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":808,"output_tokens":40,"cache_creation_input_tokens":0,"cache_read_input_tokens":8192}}
event: message_stop
data: {"type":"message_stop"}
`

func TestStreamSpec16TextTurn(t *testing.T) {
	turn := &Turn{RequestedModel: "clodex:openai-oauth:gpt-5.6-sol", Model: "gpt-5.6-sol", EstimatedInputTokens: 77}
	s, rec, state := runFrames(t, turn, spec16Frames)
	if state != StateCompleted {
		t.Fatalf("state = %v, want completed (failure %v)", state, s.Failure())
	}
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	if got := rec.text(); got != spec16SSE {
		t.Errorf("SSE mismatch\n got:\n%s\nwant:\n%s", got, spec16SSE)
	}
	if s.ResponseID() != "resp_A1" {
		t.Errorf("ResponseID = %q", s.ResponseID())
	}
	want := Usage{InputTokens: 808, CacheReadInputTokens: 8192, OutputTokens: 40}
	if s.Usage() != want {
		t.Errorf("Usage = %+v, want %+v", s.Usage(), want)
	}
	wantItems := []string{
		`{"encrypted_content":"gAAAAB-ENC1","type":"reasoning"}`,
		`{"content":[{"text":"Hi!","type":"output_text"}],"role":"assistant"}`,
	}
	assertItems(t, s.OutputItems(), wantItems)
}

func assertItems(t *testing.T, got []json.RawMessage, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d items, want %d:\n%s", len(got), len(want), joinRaw(got))
	}
	for i := range want {
		if string(got[i]) != want[i] {
			t.Errorf("item %d\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}

func joinRaw(items []json.RawMessage) string {
	var s []string
	for _, it := range items {
		s = append(s, string(it))
	}
	return strings.Join(s, "\n")
}

// A tool call on a continued socket: argument deltas are buffered and the
// null filler is stripped from the single input_json_delta.
func TestStreamSpec17ToolCall(t *testing.T) {
	frames := []string{
		`{"type":"response.created","response":{"id":"resp_B2","status":"in_progress"}}`,
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"call_9xQ","name":"Read","arguments":"","status":"in_progress"}}`,
		`{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{\"file_path\":"}`,
		`{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"\"README.md\",\"limit\":null}"}`,
		`{"type":"response.function_call_arguments.done","item_id":"fc_1","output_index":0,"arguments":"{\"file_path\":\"README.md\",\"limit\":null}"}`,
		`{"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"call_9xQ","name":"Read","arguments":"{\"file_path\":\"README.md\",\"limit\":null}","status":"completed"}}`,
		`{"type":"response.completed","response":{"id":"resp_B2","status":"completed","usage":{"input_tokens":9100,"input_tokens_details":{"cached_tokens":9000},"output_tokens":30}}}`,
	}
	want := `event: message_start
data: {"type":"message_start","message":{"id":"msg_1766000000123","type":"message","role":"assistant","content":[],"model":"clodex:openai-oauth:gpt-5.6-sol","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}
event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"call_9xQ","name":"Read","input":{}}}
event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"file_path\":\"README.md\"}"}}
event: content_block_stop
data: {"type":"content_block_stop","index":0}
event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":100,"output_tokens":30,"cache_creation_input_tokens":0,"cache_read_input_tokens":9000}}
event: message_stop
data: {"type":"message_stop"}
`
	turn := &Turn{RequestedModel: "clodex:openai-oauth:gpt-5.6-sol", Model: "gpt-5.6-sol", required: map[string][]string{"Read": {"file_path"}}}
	s, rec, state := runFrames(t, turn, frames)
	if state != StateCompleted {
		t.Fatalf("state = %v (%v)", state, s.Failure())
	}
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	if got := rec.text(); got != want {
		t.Errorf("SSE mismatch\n got:\n%s\nwant:\n%s", got, want)
	}
	assertItems(t, s.OutputItems(), []string{
		`{"arguments":"{\"file_path\":\"README.md\"}","call_id":"call_9xQ","name":"Read","type":"function_call"}`,
	})
}

// Multi-byte UTF-8 text split across deltas is forwarded delta by delta,
// each a whole string; nothing is split or mangled.
func TestStreamUTF8AcrossDeltas(t *testing.T) {
	frames := []string{
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"m","content":[]}}`,
		`{"type":"response.output_text.delta","output_index":0,"delta":"héllo 世"}`,
		`{"type":"response.output_text.delta","output_index":0,"delta":"界 🎉"}`,
		`{"type":"response.output_text.delta","output_index":0,"delta":"\ud83d\ude00 \u00e9"}`,
		`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":5,"output_tokens":3}}}`,
	}
	s, rec, _ := runFrames(t, &Turn{RequestedModel: "m"}, frames)
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	c := NewCollector()
	for _, e := range rec.events {
		name, data := splitEvent(e)
		if err := c.WriteEvent(name, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	msg, err := c.Message()
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Content []struct{ Text string } `json:"content"`
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Content) != 1 || m.Content[0].Text != "héllo 世界 🎉😀 é" {
		t.Errorf("text = %q", m.Content)
	}
	if !strings.Contains(rec.text(), `"text":"界 🎉"`) {
		t.Errorf("second delta not forwarded whole:\n%s", rec.text())
	}
}

func splitEvent(e string) (string, string) {
	lines := strings.SplitN(strings.TrimSuffix(e, "\n"), "\n", 2)
	return strings.TrimPrefix(lines[0], "event: "), strings.TrimPrefix(lines[1], "data: ")
}

func eventNames(rec *recorder) []string {
	var out []string
	for _, e := range rec.events {
		n, _ := splitEvent(e)
		out = append(out, n)
	}
	return out
}

func TestStreamNoOutputIsFailure(t *testing.T) {
	tests := []struct {
		name       string
		frames     []string
		wantStatus int
		wantType   string
	}{
		{"completed without output", []string{
			`{"type":"codex.rate_limits","plan_type":"pro","rate_limits":{"allowed":true}}`,
			`{"type":"response.created","response":{"id":"r1"}}`,
			`{"type":"response.completed","response":{"id":"r1","output":[],"usage":{"input_tokens":10,"output_tokens":0}}}`,
		}, 502, "api_error"},
		{"failed before output", []string{
			`{"type":"response.created","response":{"id":"r1"}}`,
			`{"type":"response.failed","response":{"id":"r1","status":"failed","error":{"code":"server_error","message":"secret prompt text"}}}`,
		}, 502, "api_error"},
		{"incomplete before output", []string{
			`{"type":"response.incomplete","response":{"id":"r1","status":"incomplete","incomplete_details":{"reason":"content_filter"}}}`,
		}, 400, "invalid_request_error"},
		{"usage limit error", []string{
			`{"type":"error","status":429,"error":{"type":"usage_limit_reached","message":"Usage limit reached. Resets in 4 hours."}}`,
		}, 429, "rate_limit_error"},
		{"garbage frame", []string{`not json at all`}, 502, "api_error"},
		{"bad delta type", []string{
			`{"type":"response.output_item.added","output_index":0,"item":{"type":"message"}}`,
			`{"type":"response.output_text.delta","output_index":0,"delta":{"x":1}}`,
		}, 502, "api_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			s := NewStream(&Turn{RequestedModel: "m"}, rec, "msg")
			var state State
			for _, f := range tt.frames {
				state, _ = s.Handle([]byte(f))
			}
			if state != StateFailed {
				t.Fatalf("state = %v, want failed", state)
			}
			e := s.Failure()
			if e == nil || e.Status != tt.wantStatus || e.Type != tt.wantType {
				t.Fatalf("failure = %+v, want %d %s", e, tt.wantStatus, tt.wantType)
			}
			if strings.Contains(e.Message, "secret") || strings.Contains(e.Message, "Resets in") {
				t.Errorf("upstream prose leaked into %q", e.Message)
			}
			if tt.name != "bad delta type" && s.Committed() {
				t.Errorf("committed = true, want nothing written; got %v", eventNames(rec))
			}
		})
	}
}

func TestStreamFailureAfterOutputAborts(t *testing.T) {
	frames := []string{
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"m"}}`,
		`{"type":"response.output_text.delta","output_index":0,"delta":"partial"}`,
		`{"type":"response.failed","response":{"id":"r","error":{"type":"server_error","code":"overloaded","message":"The server said something long"}}}`,
	}
	s, rec, state := runFrames(t, &Turn{RequestedModel: "m"}, frames)
	if state != StateFailed || !s.Committed() {
		t.Fatalf("state=%v committed=%v", state, s.Committed())
	}
	if err := s.Finish(); err == nil {
		t.Error("Finish after failure: want error")
	}
	if err := s.Abort(nil); err != nil {
		t.Fatal(err)
	}
	names := eventNames(rec)
	want := []string{"message_start", "content_block_start", "content_block_delta", "error"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("events = %v, want %v", names, want)
	}
	_, data := splitEvent(rec.events[3])
	wantData := `{"type":"error","error":{"type":"overloaded_error","message":"OpenAI ended the response after output had started (server_error / overloaded)"}}`
	if data != wantData {
		t.Errorf("error data\n got %s\nwant %s", data, wantData)
	}
}

func TestStreamIncompleteAfterOutputIsMaxTokens(t *testing.T) {
	frames := []string{
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"m"}}`,
		`{"type":"response.output_text.delta","output_index":0,"delta":"cut"}`,
		`{"type":"response.incomplete","response":{"id":"r9","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":20,"cache_write_tokens":10},"output_tokens":7}}}`,
	}
	s, rec, state := runFrames(t, &Turn{RequestedModel: "m"}, frames)
	if state != StateCompleted {
		t.Fatalf("state = %v", state)
	}
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	_, data := splitEvent(rec.events[len(rec.events)-2])
	want := `{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":20,"output_tokens":7,"cache_creation_input_tokens":10,"cache_read_input_tokens":20}}`
	if data != want {
		t.Errorf("message_delta\n got %s\nwant %s", data, want)
	}
}

func TestStreamUsageFallsBackToEstimate(t *testing.T) {
	frames := []string{
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"m"}}`,
		`{"type":"response.output_text.delta","output_index":0,"delta":"x"}`,
		`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":0,"output_tokens":4}}}`,
	}
	s, _, _ := runFrames(t, &Turn{RequestedModel: "m", EstimatedInputTokens: 1234}, frames)
	if got, want := s.Usage(), (Usage{InputTokens: 1234, OutputTokens: 4}); got != want {
		t.Errorf("Usage = %+v, want %+v", got, want)
	}
}

// Multi-part summaries: one thinking block per reasoning item, its parts
// paragraphs separated by a blank line, signed with the item's blob
// (docs/translation.md §9.2). Side events are harmless.
func TestStreamMultiPartSummaryAndSideEvents(t *testing.T) {
	frames := []string{
		`{"type":"codex.rate_limits","plan_type":"pro","rate_limits":{"primary":{"used_percent":7}}}`,
		`{"type":"codex.response.metadata","headers":{"x-codex-safety-buffering-enabled":"true"}}`,
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"reasoning","id":"rs","summary":[]},"sequence_number":3}`,
		`{"type":"response.reasoning_summary_part.added","item_id":"rs","output_index":0,"summary_index":0}`,
		`{"type":"response.reasoning_summary_text.delta","item_id":"rs","output_index":0,"summary_index":0,"delta":"A"}`,
		`{"type":"response.reasoning_summary_part.added","item_id":"rs","output_index":0,"summary_index":1}`,
		`{"type":"response.reasoning_summary_text.delta","item_id":"rs","output_index":0,"summary_index":1,"delta":"B"}`,
		`{"type":"some.future.event","delta":{"weird":true}}`,
		`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs","encrypted_content":"BLOB","summary":[{"type":"summary_text","text":"A"},{"type":"summary_text","text":"B"}]}}`,
		`{"type":"response.output_item.added","output_index":1,"item":{"type":"function_call","id":"fc","call_id":"c1","name":"Bash"}}`,
		`{"type":"response.output_item.done","output_index":1,"item":{"type":"function_call","id":"fc","call_id":"c1","name":"Bash","arguments":"{\"command\":\"ls\",\"tags\":[],\"timeout\":null}"}}`,
		`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":3,"output_tokens":2}}}`,
	}
	s, rec, state := runFrames(t, &Turn{RequestedModel: "m"}, frames)
	if state != StateCompleted {
		t.Fatalf("state %v %v", state, s.Failure())
	}
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"A"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"\n\nB"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"BLOB"}}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"c1","name":"Bash","input":{}}}`,
		`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"command\":\"ls\"}"}}`,
		`{"type":"content_block_stop","index":1}`,
	}
	var got []string
	for _, e := range rec.events[1 : len(rec.events)-2] {
		_, d := splitEvent(e)
		got = append(got, d)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events\n got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	assertItems(t, s.OutputItems(), []string{
		`{"encrypted_content":"BLOB","type":"reasoning"}`,
		`{"arguments":"{\"command\":\"ls\"}","call_id":"c1","name":"Bash","type":"function_call"}`,
	})
}

// When nothing was streamed, response.output of the terminal event is
// used (docs/translation.md §9.3).
func TestStreamCompletedOutputFallback(t *testing.T) {
	frames := []string{
		`{"type":"response.completed","response":{"id":"r","output":[{"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"Hello"}]}],"usage":{"input_tokens":4,"output_tokens":1}}}`,
	}
	s, rec, state := runFrames(t, &Turn{RequestedModel: "m"}, frames)
	if state != StateCompleted {
		t.Fatalf("state %v %v", state, s.Failure())
	}
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rec.text(), `"delta":{"type":"text_delta","text":"Hello"}`) {
		t.Errorf("no text delta:\n%s", rec.text())
	}
}

func TestStreamPing(t *testing.T) {
	rec := &recorder{}
	s := NewStream(&Turn{RequestedModel: "m"}, rec, "msg")
	if wrote, err := s.Ping(); wrote || err != nil {
		t.Fatalf("Ping before output = %v, %v; want nothing written", wrote, err)
	}
	if _, err := s.Handle([]byte(`{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","call_id":"c","name":"Bash"}}`)); err != nil {
		t.Fatal(err)
	}
	if wrote, err := s.Ping(); !wrote || err != nil {
		t.Fatalf("Ping after output = %v, %v", wrote, err)
	}
	if last := rec.events[len(rec.events)-1]; last != "event: ping\ndata: {\"type\":\"ping\"}\n" {
		t.Errorf("last event %q", last)
	}
}

func TestStreamWriteErrorIsReturned(t *testing.T) {
	rec := &recorder{failAt: 2}
	s := NewStream(&Turn{RequestedModel: "m"}, rec, "msg")
	_, err := s.Handle([]byte(`{"type":"response.output_item.added","output_index":0,"item":{"type":"message"}}`))
	if err == nil || !strings.Contains(err.Error(), "client gone") {
		t.Fatalf("err = %v, want the writer's error", err)
	}
}

func TestStreamContextOverflow(t *testing.T) {
	turn := &Turn{RequestedModel: "m", ContextWindow: 258400, EstimatedInputTokens: 1000}
	s := NewStream(turn, &recorder{}, "msg")
	state, _ := s.Handle([]byte(`{"type":"error","status":400,"error":{"type":"invalid_request_error","code":"context_length_exceeded","message":"Your input exceeds the context window"}}`))
	if state != StateFailed {
		t.Fatal(state)
	}
	e := s.Failure()
	if e.Status != 400 || e.Type != "invalid_request_error" || e.Message != "prompt is too long: 258401 tokens > 258400 maximum" || !e.ContextOverflow {
		t.Errorf("failure = %+v", e)
	}
	e.RequestID = "req_1"
	if got := string(retry.ErrorBody(e)); got != `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 258401 tokens > 258400 maximum"},"request_id":"req_1"}` {
		t.Errorf("body = %s", got)
	}
}

// TestResumeAfterAnEmptyStart: a response that failed after it only began
// the message (message_start, a reasoning item with a signature and no
// text, which has no block yet) leaves the turn resumable; the next attempt
// continues the same message: no second message_start, no block of the
// failed attempt (never an unsigned or orphaned thinking block).
func TestResumeAfterAnEmptyStart(t *testing.T) {
	turn := &Turn{RequestedModel: "claude-sonnet-4-5"}
	rec := &recorder{}
	s := NewStream(turn, rec, "msg_1")
	for _, f := range []string{
		`{"type":"response.created","response":{"id":"resp_1"}}`,
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"reasoning","id":"rs_1","summary":[]}}`,
		`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"BLOB1"}}`,
	} {
		if _, err := s.Handle([]byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Ping(); err != nil {
		t.Fatal(err)
	}
	st, err := s.Handle([]byte(`{"type":"response.failed","response":{"error":{"code":"server_error"}}}`))
	if err != nil || st != StateFailed {
		t.Fatalf("Handle(response.failed) = %v, %v; want StateFailed", st, err)
	}
	if !s.Resumable() {
		t.Fatal("Resumable() = false after only message_start, an empty block and a ping")
	}
	n, err := s.Resume()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Ping(); err != nil { // the message is open: pings go on
		t.Fatal(err)
	}
	for _, f := range []string{
		`{"type":"response.created","response":{"id":"resp_2"}}`,
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"m","role":"assistant","content":[]}}`,
		`{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"Hi"}`,
		`{"type":"response.output_item.done","output_index":0,"item":{"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"Hi"}]}}`,
		`{"type":"response.completed","response":{"id":"resp_2","usage":{"input_tokens":5,"output_tokens":1}}}`,
	} {
		if _, err := n.Handle([]byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Finish(); err != nil {
		t.Fatal(err)
	}
	want := `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}
event: ping
data: {"type":"ping"}
event: ping
data: {"type":"ping"}
event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}
event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}
event: content_block_stop
data: {"type":"content_block_stop","index":0}
event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":5,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}
event: message_stop
data: {"type":"message_stop"}
`
	if got := rec.text(); got != want {
		t.Errorf("SSE\n got:\n%s\nwant:\n%s", got, want)
	}
}

// TestNotResumable: once the client has content it keeps (a delta, a tool
// call it would run) or the message ended, a failure is final.
func TestNotResumable(t *testing.T) {
	tests := map[string][]string{
		"a text delta": {
			`{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"m","content":[]}}`,
			`{"type":"response.output_text.delta","output_index":0,"delta":"H"}`,
		},
		"a tool call started": {
			`{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"f","call_id":"c1","name":"Bash","arguments":""}}`,
		},
		"a thinking delta": {
			`{"type":"response.output_item.added","output_index":0,"item":{"type":"reasoning","id":"r","summary":[]}}`,
			`{"type":"response.reasoning_summary_text.delta","output_index":0,"summary_index":0,"delta":"hmm"}`,
		},
	}
	for name, frames := range tests {
		s := NewStream(&Turn{}, &recorder{}, "msg_1")
		for _, f := range frames {
			if _, err := s.Handle([]byte(f)); err != nil {
				t.Fatal(err)
			}
		}
		if s.Resumable() {
			t.Errorf("%s: Resumable() = true, want false", name)
		}
	}
	s := NewStream(&Turn{}, &recorder{}, "msg_1")
	if err := s.Abort(nil); err != nil {
		t.Fatal(err)
	}
	if s.Resumable() {
		t.Error("after Abort: Resumable() = true, want false")
	}
}
