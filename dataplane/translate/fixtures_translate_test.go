package translate

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// describe summarises input items as "role(part types)" or the item type.
func describe(t *testing.T, items []json.RawMessage) []string {
	t.Helper()
	var out []string
	for _, it := range items {
		var m map[string]any
		if err := json.Unmarshal(it, &m); err != nil {
			t.Fatalf("item not JSON: %s", it)
		}
		role, ok := m["role"].(string)
		if !ok {
			out = append(out, m["type"].(string))
			continue
		}
		switch c := m["content"].(type) {
		case string:
			out = append(out, role+"(string)")
		case []any:
			var types []string
			for _, p := range c {
				types = append(types, p.(map[string]any)["type"].(string))
			}
			out = append(out, role+"("+strings.Join(types, ",")+")")
		}
	}
	return out
}

func toolNames(t *testing.T, turn *Turn) []string {
	var names []string
	if tools, ok := frameOf(t, turn)["tools"].([]any); ok {
		for _, tl := range tools {
			names = append(names, tl.(map[string]any)["name"].(string))
		}
	}
	return names
}

var cc332Tools = []string{"Agent", "Bash", "Edit", "ListAgents", "Read", "ReportFindings", "ScheduleWakeup", "Skill", "ToolSearch", "Workflow", "Write"}

// Every captured Claude Code request body translates, with structural
// assertions on the result. Expected session hashes were computed outside
// Go (sha256 of the session id, first 32 hex digits).
func TestFixtureRequests(t *testing.T) {
	tests := []struct {
		file          string
		path          []string
		upstream      string
		effort        string
		cacheKey      string
		instrPrefix   string
		tools         []string
		toolCount     int // when tools is nil
		input         []string
		headerSession string
	}{
		{file: "cc-2.1.332-messages-request-custom-model.json", upstream: "gpt-5-codex", effort: "high",
			cacheKey: "relay-session-59871c92abfaa2d75fb766cf6de53aa0", instrPrefix: "You are a Claude agent, built on Anthropic's Claude Agent SDK.\n\nYou are an agent",
			tools: cc332Tools, input: []string{"user(input_text,input_text)", "developer(string)"}},
		{file: "cc-2.1.332-messages-request-default-model.json", upstream: "gpt-5.5", effort: "medium",
			cacheKey: "relay-session-0862719e19244f9fc9311e2b5c8e725a", instrPrefix: "You are a Claude agent, built on Anthropic's Claude Agent SDK.\n",
			tools: cc332Tools, input: []string{"user(input_text,input_text)", "developer(string)"}},
		{file: "cc-2.1.332-messages-request-bare.json", upstream: "gpt-5-codex", effort: "high",
			cacheKey: "relay-session-37c2e9de02c84ecc245ffee12ab0c381", instrPrefix: "You are a Claude agent, built on Anthropic's Claude Agent SDK.\nCWD: <workdir>",
			tools: []string{"Bash", "Edit", "Read"}, input: []string{"user(input_text)"}},
		{file: "cc-2.1.332-tool-bash-turn2-request.json", upstream: "gpt-5-codex", effort: "high",
			cacheKey: "relay-session-7154e7abc529fab9148de424c1a825b8", instrPrefix: "You are a Claude agent, built on Anthropic's Claude Agent SDK.\n",
			tools: cc332Tools, input: []string{"user(input_text,input_text)", "developer(string)", "function_call", "function_call_output"}},
		{file: "cc-2.1.197-requests-custom-model.json", path: []string{"messages_request", "body"}, upstream: "gpt-5-codex", effort: "high",
			cacheKey: "relay-session-97a7929030f34d1e6a6d8d898ec69ddb", instrPrefix: "You are a Claude agent, built on Anthropic's Claude Agent SDK.\n",
			toolCount: 24, input: []string{"user(input_text,input_text)", "developer(string)"}},
		{file: "cc-2.1.197-interactive-request.json", upstream: "gpt-5-codex", effort: "high",
			cacheKey: "relay-session-6a6a893cf0f203de0c3aca87d88641be", instrPrefix: "You are Claude Code, Anthropic's official CLI for Claude.\n",
			toolCount: 27, input: []string{"user(input_text,input_text)", "developer(string)"}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			body := fixtureBody(t, tt.file, tt.path...)
			req, err := DecodeRequest(body)
			if err != nil {
				t.Fatalf("DecodeRequest: %v", err)
			}
			turn, err := ToResponses(req, Options{SessionHeader: "not-a-uuid"})
			if err != nil {
				t.Fatal(err)
			}
			f := frameOf(t, turn)
			if turn.Model != tt.upstream || f["model"] != tt.upstream || turn.RequestedModel != req.Model() {
				t.Errorf("model %q (frame %v), requested %q", turn.Model, f["model"], turn.RequestedModel)
			}
			if turn.Effort != tt.effort || f["reasoning"].(map[string]any)["effort"] != tt.effort {
				t.Errorf("effort %q, reasoning %v", turn.Effort, f["reasoning"])
			}
			if turn.PromptCacheKey != tt.cacheKey || f["prompt_cache_key"] != tt.cacheKey {
				t.Errorf("prompt_cache_key %q", turn.PromptCacheKey)
			}
			instr := f["instructions"].(string)
			if !strings.HasPrefix(instr, tt.instrPrefix) || strings.Contains(instr, "x-anthropic-billing-header") {
				t.Errorf("instructions start %q", instr[:min(len(instr), 120)])
			}
			names := toolNames(t, turn)
			if tt.tools != nil && !reflect.DeepEqual(names, tt.tools) {
				t.Errorf("tools %v, want %v", names, tt.tools)
			}
			if tt.tools == nil && len(names) != tt.toolCount {
				t.Errorf("%d tools, want %d", len(names), tt.toolCount)
			}
			if got := describe(t, turn.Input); !reflect.DeepEqual(got, tt.input) {
				t.Errorf("input %v, want %v", got, tt.input)
			}
			if f["store"] != false || f["stream"] != true || !reflect.DeepEqual(f["include"], []any{"reasoning.encrypted_content"}) {
				t.Errorf("fixed fields store=%v stream=%v include=%v", f["store"], f["stream"], f["include"])
			}
			for _, absent := range []string{"max_output_tokens", "metadata", "temperature", "tool_choice", "parallel_tool_calls", "previous_response_id"} {
				if _, ok := f[absent]; ok {
					t.Errorf("frame has %s", absent)
				}
			}
			if !turn.Stream {
				t.Error("Stream = false; the captures all stream")
			}
			if turn.EstimatedInputTokens < len(body)/8 || turn.ContextWindow != 258400 {
				t.Errorf("estimate %d for %d bytes, window %d", turn.EstimatedInputTokens, len(body), turn.ContextWindow)
			}
		})
	}
}

func TestFixtureCountTokensBodies(t *testing.T) {
	for _, key := range []string{"first", "with_tools"} {
		body := fixtureBody(t, "cc-2.1.332-count-tokens-requests.json", key, "body")
		n, err := CountTokens(body)
		if err != nil {
			t.Fatal(err)
		}
		if n < 1 {
			t.Errorf("%s: estimate %d", key, n)
		}
		// A count_tokens body has no max_tokens: it is not a Messages request.
		if _, err := DecodeRequest(body); err == nil || !strings.Contains(err.Error(), "max_tokens") {
			t.Errorf("%s: DecodeRequest err = %v", key, err)
		}
	}
}

// wrap builds a Messages body around captured messages and tools.
func wrap(t *testing.T, messages, tools json.RawMessage) string {
	t.Helper()
	b := `{"model":"gpt-5-codex","max_tokens":32000,"stream":true,"messages":` + string(messages)
	if tools != nil {
		b += `,"tools":` + string(tools)
	}
	return b + `}`
}

const userRunEcho = `{"role":"user","content":[{"type":"text","text":"run echo"}]}`

func TestFixtureThinkingSignatureRoundTrip(t *testing.T) {
	last2 := fixtureJSON(t, "cc-2.1.332-thinking-signature-roundtrip.json", "turn2_last_two_messages")
	msgs := json.RawMessage(`[` + userRunEcho + `,` + string(last2[1:]))
	turn := translate(t, wrap(t, msgs, nil), Options{})
	want := []string{
		`{"content":[{"text":"run echo","type":"input_text"}],"role":"user"}`,
		`{"encrypted_content":"c2lnLXN0dWItb3BhcXVlLWJsb2I=","summary":[{"text":"I should run echo.","type":"summary_text"}],"type":"reasoning"}`,
		`{"arguments":"{\"command\":\"echo hello-from-tool\",\"description\":\"Print a greeting\"}","call_id":"toolu_stub_f74c8bbc9a54450e","name":"Bash","type":"function_call"}`,
		`{"call_id":"toolu_stub_f74c8bbc9a54450e","output":"hello-from-tool","type":"function_call_output"}`,
	}
	assertItems(t, turn.Input, want)
}

func TestFixtureToolSearch(t *testing.T) {
	const file = "cc-2.1.332-toolsearch-turn2.json"
	toolSearch := fixtureJSON(t, file, "ToolSearch_tool")
	notebook := fixtureJSON(t, file, "turn2_NotebookEdit_tool")
	placeholder := fixtureJSON(t, file, "DeferredToolPlaceholder")
	tools := json.RawMessage(`[` + string(toolSearch[1:len(toolSearch)-1]) + `,` + string(notebook[1:len(notebook)-1]) + `,` + string(placeholder[1:len(placeholder)-1]) + `]`)
	last2 := fixtureJSON(t, file, "turn2_last_two_messages")

	// Turn 1: nothing referenced yet; the deferred tool and the placeholder stay hidden.
	turn1 := translate(t, wrap(t, json.RawMessage(`[`+userRunEcho+`]`), tools), Options{})
	if got := toolNames(t, turn1); !reflect.DeepEqual(got, []string{"ToolSearch"}) {
		t.Errorf("turn 1 tools %v", got)
	}

	// Turn 2: the tool_reference exposes NotebookEdit and reads as text.
	turn2 := translate(t, wrap(t, json.RawMessage(`[`+userRunEcho+`,`+string(last2[1:])), tools), Options{})
	if got := toolNames(t, turn2); !reflect.DeepEqual(got, []string{"ToolSearch", "NotebookEdit"}) {
		t.Errorf("turn 2 tools %v", got)
	}
	assertItems(t, turn2.Input[1:], []string{
		`{"arguments":"{\"max_results\":5,\"query\":\"select:NotebookEdit\"}","call_id":"toolu_stub_944d8e1243df4171","name":"ToolSearch","type":"function_call"}`,
		`{"call_id":"toolu_stub_944d8e1243df4171","output":"Tool NotebookEdit is now available.","type":"function_call_output"}`,
	})
	golden(t, "toolsearch-turn2.frame.json", turn2)
}

func TestFixturePermissionDeniedAndRead(t *testing.T) {
	denied := fixtureJSON(t, "cc-2.1.332-permission-denied-tool-result.json", "turn2_last_message")
	msgs := `[` + userRunEcho + `,{"role":"assistant","content":[{"type":"tool_use","id":"toolu_stub_09801774ffba4c87","name":"Bash","input":{"command":"touch made-by-tool.txt"}}]},` + string(denied) + `]`
	turn := translate(t, wrap(t, json.RawMessage(msgs), nil), Options{})
	var out struct{ Output, CallID string }
	if err := json.Unmarshal(turn.Input[2], &out); err != nil {
		t.Fatalf("input[2] %s: %v", turn.Input[2], err)
	}
	if !strings.HasPrefix(out.Output, "touch in '<workdir>/made-by-tool.txt' needs approval.") {
		t.Errorf("denied output %q", out.Output)
	}

	read := fixtureJSON(t, "cc-2.1.332-tool-read-turn2-messages.json", "messages")
	turn = translate(t, wrap(t, read, nil), Options{})
	if got := describe(t, turn.Input); !reflect.DeepEqual(got, []string{"user(input_text,input_text)", "developer(string)", "function_call", "function_call_output"}) {
		t.Errorf("read input %v", got)
	}
	want := `{"call_id":"toolu_stub_c266305dee1a4c22","output":"1\thello from a file\n2\t","type":"function_call_output"}`
	if string(turn.Input[3]) != want {
		t.Errorf("read output\n got %s\nwant %s", turn.Input[3], want)
	}
}

func TestFixtureBareGolden(t *testing.T) {
	body := fixtureBody(t, "cc-2.1.332-messages-request-bare.json")
	req, err := DecodeRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	turn, err := ToResponses(req, Options{})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "bare.frame.json", turn)
}

// golden compares the indented response.create frame of turn with
// testdata/<name>; -update rewrites it.
func golden(t *testing.T, name string, turn *Turn) {
	t.Helper()
	f, err := turn.CreateFrame("", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if err := json.Indent(&got, f, "", "  "); err != nil {
		t.Fatal(err)
	}
	got.WriteByte('\n')
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with -update to create): %v", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("frame differs from %s (review, then -update):\n%s", path, got.String())
	}
}
