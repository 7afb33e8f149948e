package codexsim

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"
	"time"
)

func itemsOf(t *testing.T, e event) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, it := range responseOf(t, e)["output"].([]any) {
		out = append(out, it.(map[string]any))
	}
	return out
}

// joined concatenates the "delta" of every event of type typ.
func joined(evs []event, typ string) string {
	var b strings.Builder
	for _, e := range evs {
		if e["type"] == typ {
			b.WriteString(e["delta"].(string))
		}
	}
	return b.String()
}

func countType(evs []event, typ string) int {
	n := 0
	for _, e := range evs {
		if e["type"] == typ {
			n++
		}
	}
	return n
}

func TestDirectives(t *testing.T) {
	_, ts := testServer(t, Config{})
	c := mustDial(t, ts)
	turn := func(t *testing.T, text string) []event {
		t.Helper()
		send(t, c, create(text, nil))
		evs := readResponse(t, c)
		for i, e := range evs {
			if e["type"] == "error" {
				continue
			}
			if _, ok := e["sequence_number"]; !ok {
				t.Errorf("event %d (%v) has no sequence_number", i, e["type"])
			}
		}
		return evs
	}

	t.Run("reply", func(t *testing.T) {
		evs := turn(t, "please\n#sim reply The quick brown fox jumps over the lazy dog")
		want := "The quick brown fox jumps over the lazy dog"
		if got := joined(evs, "response.output_text.delta"); got != want {
			t.Errorf("text deltas = %q, want %q", got, want)
		}
		if n := countType(evs, "response.output_text.delta"); n < 2 {
			t.Errorf("%d text deltas, want the reply split into several", n)
		}
		items := itemsOf(t, last(evs))
		if len(items) != 1 || items[0]["type"] != "message" {
			t.Fatalf("output = %v, want one message", items)
		}
		if got := items[0]["content"].([]any)[0].(map[string]any)["text"]; got != want {
			t.Errorf("message text = %q, want %q", got, want)
		}
		want2 := []string{"codex.rate_limits", "response.created", "response.in_progress", "response.output_item.added",
			"response.content_part.added", "response.output_text.delta", "response.output_text.done",
			"response.content_part.done", "response.output_item.done", "response.completed"}
		if got := collapse(types(evs)); !slices.Equal(got, collapse(want2)) {
			t.Errorf("events = %v, want %v", got, want2)
		}
		for i, e := range evs {
			if num(e["sequence_number"]) != int64(i) {
				t.Errorf("event %d sequence_number = %v, want %d", i, e["sequence_number"], i)
				break
			}
		}
	})

	t.Run("parallel calls", func(t *testing.T) {
		evs := turn(t, "#sim call Read {\"file_path\": \"README.md\"}\n#sim call Bash {\"command\":\"ls -la\",\"timeout\":5}")
		items := itemsOf(t, last(evs))
		want := []struct{ name, args, callID string }{
			{"Read", `{"file_path":"README.md"}`, "call_1"},
			{"Bash", `{"command":"ls -la","timeout":5}`, "call_2"},
		}
		if len(items) != len(want) {
			t.Fatalf("output = %v, want %d function calls", items, len(want))
		}
		for i, w := range want {
			it := items[i]
			if it["type"] != "function_call" || it["name"] != w.name || it["arguments"] != w.args || it["call_id"] != w.callID {
				t.Errorf("item %d = %v, want function_call %s %s %s", i, it, w.name, w.args, w.callID)
			}
		}
		var args [2]strings.Builder
		for _, e := range evs {
			if e["type"] == "response.function_call_arguments.delta" {
				args[num(e["output_index"])].WriteString(e["delta"].(string))
			}
			if e["type"] == "response.output_item.added" {
				if it := e["item"].(map[string]any); it["arguments"] != "" {
					t.Errorf("output_item.added arguments = %v, want empty", it["arguments"])
				}
			}
		}
		for i, w := range want {
			if args[i].String() != w.args {
				t.Errorf("argument deltas of call %d = %q, want %q", i, args[i].String(), w.args)
			}
		}
		if countType(evs, "response.function_call_arguments.done") != 2 || countType(evs, "response.output_text.delta") != 0 {
			t.Errorf("events %v: want two arguments.done and no text", types(evs))
		}
		// call ids keep counting on the socket.
		evs = turn(t, "#sim call Read {}")
		if got := itemsOf(t, last(evs))[0]["call_id"]; got != "call_3" {
			t.Errorf("next call_id = %v, want call_3", got)
		}
	})

	t.Run("reasoning", func(t *testing.T) {
		evs := turn(t, "#sim reasoning Thinking about it | Deciding now\n#sim reply done")
		rid := responseOf(t, last(evs))["id"].(string)
		items := itemsOf(t, last(evs))
		if len(items) != 2 || items[0]["type"] != "reasoning" || items[1]["type"] != "message" {
			t.Fatalf("output = %v, want reasoning then message", items)
		}
		wantBlob := base64.StdEncoding.EncodeToString([]byte("sim-reasoning:" + rid + ":0"))
		if items[0]["encrypted_content"] != wantBlob {
			t.Errorf("encrypted_content = %v, want %s", items[0]["encrypted_content"], wantBlob)
		}
		summary := items[0]["summary"].([]any)
		if len(summary) != 2 || summary[0].(map[string]any)["text"] != "Thinking about it" || summary[1].(map[string]any)["text"] != "Deciding now" {
			t.Errorf("summary = %v", summary)
		}
		want := []string{"codex.rate_limits", "response.created", "response.in_progress", "response.output_item.added",
			"response.reasoning_summary_part.added", "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
			"response.reasoning_summary_part.added", "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
			"response.output_item.done", "response.output_item.added"}
		if got := collapse(types(evs))[:len(want)-1]; !slices.Equal(got, collapse(want)[:len(want)-1]) {
			t.Errorf("events = %v\nwant prefix %v", got, want)
		}
		var parts [2]strings.Builder
		for _, e := range evs {
			if e["type"] == "response.reasoning_summary_text.delta" {
				parts[num(e["summary_index"])].WriteString(e["delta"].(string))
			}
		}
		if parts[0].String() != "Thinking about it" || parts[1].String() != "Deciding now" {
			t.Errorf("summary deltas = %q, %q", parts[0].String(), parts[1].String())
		}
		_, _, out, reasoning, _ := usage(t, last(evs))
		if reasoning <= 0 || reasoning >= out {
			t.Errorf("reasoning_tokens = %d of output_tokens %d, want 0 < reasoning < output", reasoning, out)
		}
	})

	t.Run("fail", func(t *testing.T) {
		evs := turn(t, "#sim fail server_error")
		e := last(evs)
		if e["type"] != "response.failed" {
			t.Fatalf("terminal = %v, want response.failed", e["type"])
		}
		r := responseOf(t, e)
		if r["status"] != "failed" || r["error"].(map[string]any)["code"] != "server_error" {
			t.Errorf("failed response = %v", r)
		}
		if n := countType(evs, "response.output_item.added"); n != 0 {
			t.Errorf("%d output items before the failure, want none", n)
		}
	})

	t.Run("incomplete", func(t *testing.T) {
		evs := turn(t, "#sim reply partial answer\n#sim incomplete max_output_tokens")
		e := last(evs)
		if e["type"] != "response.incomplete" {
			t.Fatalf("terminal = %v, want response.incomplete", e["type"])
		}
		r := responseOf(t, e)
		if r["status"] != "incomplete" || r["incomplete_details"].(map[string]any)["reason"] != "max_output_tokens" {
			t.Errorf("incomplete response = %v", r)
		}
		if got := joined(evs, "response.output_text.delta"); got != "partial answer" {
			t.Errorf("text before incomplete = %q, want %q", got, "partial answer")
		}
	})

	t.Run("error frame", func(t *testing.T) {
		evs := turn(t, "#sim error usage_limit_reached 429")
		if len(evs) != 1 {
			t.Fatalf("events = %v, want only the error frame", types(evs))
		}
		er := errorOf(t, evs[0])
		if er["code"] != "usage_limit_reached" || num(evs[0]["status"]) != 429 {
			t.Errorf("error frame = %v, want usage_limit_reached 429", evs[0])
		}
		evs = turn(t, "#sim error websocket_connection_limit_reached 0")
		if _, ok := evs[0]["status"]; ok {
			t.Errorf("status 0 frame = %v, want no status field", evs[0])
		}
	})

	t.Run("context length", func(t *testing.T) {
		evs := turn(t, "#sim context-length")
		e := last(evs)
		if e["type"] != "response.failed" {
			t.Fatalf("terminal = %v, want response.failed", e["type"])
		}
		er := responseOf(t, e)["error"].(map[string]any)
		if er["code"] != "context_length_exceeded" || !strings.Contains(er["message"].(string), "context window") {
			t.Errorf("error = %v, want context_length_exceeded", er)
		}
	})

	t.Run("delay", func(t *testing.T) {
		start := time.Now()
		evs := turn(t, "#sim delay 30ms\n#sim reply later")
		if el := time.Since(start); el < 30*time.Millisecond {
			t.Errorf("response came after %v, want at least the 30ms delay", el)
		}
		if last(evs)["type"] != "response.completed" {
			t.Errorf("terminal = %v", last(evs)["type"])
		}
	})

	t.Run("default replies", func(t *testing.T) {
		long := strings.Repeat("abcdefghij", 8) // 80 characters
		evs := turn(t, long)
		if got, want := joined(evs, "response.output_text.delta"), "Hello from clodex-sim. You said: "+long[:60]; got != want {
			t.Errorf("default reply = %q, want %q", got, want)
		}
		send(t, c, map[string]any{"type": "response.create", "model": "m", "input": []any{
			map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "tool says " + long}}})
		evs = readResponse(t, c)
		if got, want := joined(evs, "response.output_text.delta"), "Tool result received: "+("tool says " + long)[:60]; got != want {
			t.Errorf("tool-output reply = %q, want %q", got, want)
		}
		// Directives in a tool output drive the model too.
		send(t, c, map[string]any{"type": "response.create", "model": "m", "input": []any{
			map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "#sim reply from tool"}}})
		if got := joined(readResponse(t, c), "response.output_text.delta"); got != "from tool" {
			t.Errorf("reply = %q, want %q", got, "from tool")
		}
		// Only the newest user message counts.
		send(t, c, map[string]any{"type": "response.create", "model": "m", "input": []any{
			map[string]any{"role": "user", "content": "#sim fail server_error"},
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "#sim fail other"}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": "#sim reply newest"}}},
		}})
		if got := joined(readResponse(t, c), "response.output_text.delta"); got != "newest" {
			t.Errorf("reply = %q, want %q", got, "newest")
		}
	})
}

func TestStall(t *testing.T) {
	srv, ts := testServer(t, Config{})
	c := mustDial(t, ts)
	send(t, c, create("#sim stall", nil))
	if e := readEvent(t, c); e["type"] != "codex.rate_limits" {
		t.Fatalf("first event %v", e["type"])
	}
	if e := readEvent(t, c); e["type"] != "response.created" {
		t.Fatalf("second event %v", e["type"])
	}
	// Nothing more arrives: the next frame we read answers our next create.
	send(t, c, create("#sim reply x", nil))
	if code := errorOf(t, readEvent(t, c))["code"]; code != "response_in_progress" {
		t.Errorf("code %v, want response_in_progress (the stalled response is still in flight)", code)
	}
	if st := srv.Stats(); st.Responses != 1 || st.CompletedResponses != 0 {
		t.Errorf("responses=%d completed=%d, want 1 and 0", st.Responses, st.CompletedResponses)
	}
}

func TestParsePlanErrors(t *testing.T) {
	tests := []string{
		"#sim call",
		"#sim call Read [1,2]",
		"#sim call Read {bad",
		"#sim fail",
		"#sim fail two words",
		"#sim incomplete",
		"#sim error",
		"#sim error code 200",
		"#sim error code x",
		"#sim delay",
		"#sim delay -1s",
		"#sim delay 2h",
		"#sim nope",
	}
	for _, text := range tests {
		t.Run(text, func(t *testing.T) {
			_, err := parsePlan("hello\n"+text, false)
			if err == nil {
				t.Fatalf("parsePlan(%q) succeeded, want an error", text)
			}
			if err.Code != "invalid_sim_directive" || !strings.Contains(err.Message, "want #sim") && !strings.Contains(err.Message, "want one of") {
				t.Errorf("error = %v, want invalid_sim_directive naming the syntax", err)
			}
		})
	}
	// Lines that merely mention #sim are not directives.
	for _, text := range []string{"#simulate", "see #sim reply below", "#simreply x"} {
		if p, err := parsePlan(text, false); err != nil || p.reply != nil {
			t.Errorf("parsePlan(%q) = %+v, %v; want no directive", text, p, err)
		}
	}
}

func TestSplitDeltas(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"Hi", []string{"Hi"}},
		{"Hi from sim", []string{"Hi", " from", " sim"}},
		{"abcdefghijklmnopqrstuvwxyz", []string{"abcdefghijklmnop", "qrstuvwxyz"}},
		{"ééééééééé", []string{"éééééééé", "é"}},
	}
	for _, tt := range tests {
		if got := splitDeltas(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("splitDeltas(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
