package translate

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func translate(t *testing.T, body string, opts Options) *Turn {
	t.Helper()
	req, err := DecodeRequest([]byte(body))
	if err != nil {
		t.Fatalf("DecodeRequest: %v", err)
	}
	turn, err := ToResponses(req, opts)
	if err != nil {
		t.Fatalf("ToResponses: %v", err)
	}
	return turn
}

func frameOf(t *testing.T, turn *Turn) map[string]any {
	t.Helper()
	f, err := turn.CreateFrame("", nil)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(f, &m); err != nil {
		t.Fatalf("frame is not JSON: %v\n%s", err, f)
	}
	return m
}

func mustJSON(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("bad expectation %s: %v", s, err)
	}
	return v
}

// The request of a text turn (billing header, cache_control, one tool,
// session metadata, effort high) produces the expected frame
// (prompt_cache_key is the real hash of the session id, computed
// independently).
func TestCreateFrameSpec16(t *testing.T) {
	body := `{
  "model": "clodex:openai-oauth:gpt-5.6-sol",
  "max_tokens": 32000,
  "stream": true,
  "system": [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.239.a1b; cc_entrypoint=cli; cch=3f2e1;"},
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI...", "cache_control": {"type": "ephemeral"}}
  ],
  "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}],
  "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}],
  "metadata": {"user_id": "{\"device_id\":\"d1\",\"account_uuid\":\"a1\",\"session_id\":\"4f6c2a9e-1b7d-4c3e-9a21-0d5e8f7b6c11\"}"},
  "output_config": {"effort": "high"}
}`
	turn := translate(t, body, Options{})
	want := mustJSON(t, `{"type":"response.create","model":"gpt-5.6-sol",
 "input":[{"role":"user","content":[{"type":"input_text","text":"Say hi"}]}],
 "store":false,
 "instructions":"You are Claude Code, Anthropic's official CLI...",
 "include":["reasoning.encrypted_content"],
 "prompt_cache_key":"relay-session-9c7e0441f55a229675fc412b6d233499",
 "reasoning":{"effort":"high","summary":"detailed"},
 "tools":[{"type":"function","name":"Read","description":"Read a file","parameters":{"type":"object","properties":{"file_path":{"type":"string"}},"required":["file_path"]}}],
 "stream":true}`)
	if got := frameOf(t, turn); !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		t.Errorf("frame\n got %s\nwant %s", g, mustMarshal(want))
	}
	if turn.Stream != true || turn.RequestedModel != "clodex:openai-oauth:gpt-5.6-sol" || turn.Effort != "high" {
		t.Errorf("turn = %+v", turn)
	}
	// Continuation: only the delta, plus previous_response_id.
	delta := []json.RawMessage{json.RawMessage(`{"content":[{"text":"Read README.md","type":"input_text"}],"role":"user"}`)}
	f, err := turn.CreateFrame("resp_A1", delta)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(f, &m); err != nil {
		t.Fatalf("continuation frame %s: %v", f, err)
	}
	if m["previous_response_id"] != "resp_A1" || len(m["input"].([]any)) != 1 {
		t.Errorf("continuation frame %s", f)
	}
	if _, err := turn.CreateFrame("", []json.RawMessage{json.RawMessage(`{bad`)}); err == nil {
		t.Error("CreateFrame accepted an invalid item")
	}
}

func mustMarshal(v any) string { b, _ := json.Marshal(v); return string(b) }

// inputOf translates messages (and optional extra top-level fields) and
// returns the input items as generic JSON.
func inputOf(t *testing.T, model, messages string, extra string) []any {
	t.Helper()
	body := `{"model":"` + model + `","max_tokens":10,"messages":` + messages + extra + `}`
	turn := translate(t, body, Options{})
	var out []any
	for _, it := range turn.Input {
		var v any
		if err := json.Unmarshal(it, &v); err != nil {
			t.Fatalf("input item is not JSON: %s", it)
		}
		out = append(out, v)
	}
	return out
}

func TestInputTranslation(t *testing.T) {
	tests := []struct {
		name     string
		model    string
		messages string
		want     string
	}{
		{"string content", "gpt-5.5", `[{"role":"user","content":"hi"}]`,
			`[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]`},
		{"empty text kept", "gpt-5.5", `[{"role":"user","content":[{"type":"text","text":""}]}]`,
			`[{"role":"user","content":[{"type":"input_text","text":""}]}]`},
		{"system message in place as developer", "gpt-5.5",
			`[{"role":"user","content":"a"},{"role":"system","content":[{"type":"text","text":"env"},{"type":"text","text":"  "},{"type":"text","text":"more"}]},{"role":"user","content":"b"}]`,
			`[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"role":"developer","content":"env"},{"role":"developer","content":"more"},{"role":"user","content":[{"type":"input_text","text":"b"}]}]`},
		{"system message as system for a chat model", "gpt-5-chat-latest",
			`[{"role":"system","content":"env"}]`,
			`[{"role":"system","content":"env"}]`},
		{"images", "gpt-5.5",
			`[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},{"type":"image","source":{"type":"url","url":"https://x/y.png"}},{"type":"text","text":"what?"}]}]`,
			`[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AAAA"},{"type":"input_image","image_url":"https://x/y.png"},{"type":"input_text","text":"what?"}]}]`},
		{"assistant text, thinking, tool_use", "gpt-5.5",
			`[{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"SIG"},{"type":"thinking","thinking":"","signature":"SIG2"},{"type":"thinking","thinking":"no sig"},{"type":"redacted_thinking","data":"x"},{"type":"text","text":"one"},{"type":"text","text":"two"},{"type":"tool_use","id":"call_1__ts__abc","name":"Bash","input":{"z":1,"a":[true,null]}}]}]`,
			`[{"type":"reasoning","encrypted_content":"SIG","summary":[{"type":"summary_text","text":"hmm"}]},{"type":"reasoning","encrypted_content":"SIG2","summary":[]},{"role":"assistant","content":[{"type":"output_text","text":"one"}]},{"role":"assistant","content":[{"type":"output_text","text":"two"}]},{"type":"function_call","call_id":"call_1","name":"Bash","arguments":"{\"a\":[true,null],\"z\":1}"}]`},
		{"thinking as the data plane once streamed it: unsigned parts, then the signed last part", "gpt-5.5",
			`[{"role":"assistant","content":[{"type":"thinking","thinking":"part one","signature":""},{"type":"thinking","thinking":"part two","signature":"SIG"},{"type":"thinking","thinking":"no blob","signature":"clodex:unsigned"},{"type":"text","text":"done"}]}]`,
			`[{"type":"reasoning","encrypted_content":"SIG","summary":[{"type":"summary_text","text":"part two"}]},{"role":"assistant","content":[{"type":"output_text","text":"done"}]}]`},
		{"tool results before the user text", "gpt-5.5",
			`[{"role":"user","content":[{"type":"text","text":"after"},{"type":"tool_result","tool_use_id":"c1","content":"out1","is_error":true},{"type":"tool_result","tool_use_id":"c2::ts::q","content":[{"type":"text","text":"x"}]},{"type":"tool_result","tool_use_id":"c3"}]}]`,
			`[{"type":"function_call_output","call_id":"c1","output":"out1"},{"type":"function_call_output","call_id":"c2","output":"[{\"type\":\"text\",\"text\":\"x\"}]"},{"type":"function_call_output","call_id":"c3","output":""},{"role":"user","content":[{"type":"input_text","text":"after"}]}]`},
		{"images lifted out of a tool result", "gpt-5.5",
			`[{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":[{"type":"text","text":"shot"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},{"type":"image","source":{"type":"url","url":"https://i/2.png"}}]},{"type":"text","text":"look"}]}]`,
			`[{"type":"function_call_output","call_id":"c1","output":"[{\"type\":\"text\",\"text\":\"shot\"},{\"type\":\"image\",\"note\":\"attached to the next user message as image 1 of tool call c1\"},{\"type\":\"image\",\"note\":\"attached to the next user message as image 2 of tool call c1\"}]"},{"role":"user","content":[{"type":"input_text","text":"The following image is image 1 of tool call c1:"},{"type":"input_image","image_url":"data:image/png;base64,AAAA"},{"type":"input_text","text":"The following image is image 2 of tool call c1:"},{"type":"input_image","image_url":"https://i/2.png"},{"type":"input_text","text":"look"}]}]`},
		{"lifted image without user text", "gpt-5.5",
			`[{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":[{"type":"image","source":{"type":"url","url":"https://i/1.png"}}]}]}]`,
			`[{"type":"function_call_output","call_id":"c1","output":"[{\"type\":\"image\",\"note\":\"attached to the next user message as image 1 of tool call c1\"}]"},{"role":"user","content":[{"type":"input_text","text":"The following image is image 1 of tool call c1:"},{"type":"input_image","image_url":"https://i/1.png"}]}]`},
		{"tool_reference results", "gpt-5.5",
			`[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"tool_reference","tool_name":"NotebookEdit"},{"type":"tool_reference","tool_name":"WebFetch"}]},{"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"found"},{"type":"tool_reference","tool_name":"X"}]}]}]`,
			`[{"type":"function_call_output","call_id":"t1","output":"Tool NotebookEdit is now available.\nTool WebFetch is now available."},{"type":"function_call_output","call_id":"t2","output":"[{\"type\":\"text\",\"text\":\"found\"},{\"type\":\"text\",\"text\":\"Tool X is now available.\"}]"}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := inputOf(t, tt.model, tt.messages, "")
			want := mustJSON(t, tt.want)
			if !reflect.DeepEqual(any(got), want) && !(len(got) == 0 && len(want.([]any)) == 0) {
				t.Errorf("input\n got %s\nwant %s", mustMarshal(got), mustMarshal(want))
			}
		})
	}
}

func TestInstructions(t *testing.T) {
	tests := []struct {
		name, system, want string
	}{
		{"absent", ``, defaultInstructions},
		{"string", `,"system":"  Be brief.  "`, "Be brief."},
		{"billing line only", `,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=1;"},{"type":"text","text":"A"},{"type":"text","text":"B"}]`, "A\nB"},
		{"billing line with more lines", `,"system":"x-anthropic-billing-header: cch=2;\nKeep this."`, "Keep this."},
		{"billing header not at start kept", `,"system":[{"type":"text","text":"A x-anthropic-billing-header: 1"}]`, "A x-anthropic-billing-header: 1"},
		{"blank", `,"system":[{"type":"text","text":"   "}]`, defaultInstructions},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			turn := translate(t, `{"model":"gpt-5.5","max_tokens":1,"messages":[{"role":"user","content":"hi"}]`+tt.system+`}`, Options{})
			if got := frameOf(t, turn)["instructions"]; got != tt.want {
				t.Errorf("instructions = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestToolsAndToolChoice(t *testing.T) {
	const read = `{"name":"Read","description":"r","input_schema":{"type":"object","required":["file_path"]}}`
	const deferred = `{"name":"NotebookEdit","description":"n","input_schema":{"type":"object"},"defer_loading":true}`
	const placeholder = `{"name":"DeferredToolPlaceholder","description":"p","input_schema":{"type":"object","properties":{}},"defer_loading":true}`
	const server = `{"type":"web_search_20250305","name":"web_search","max_uses":3}`
	refMsg := `[{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"ToolSearch","input":{"query":"select:NotebookEdit"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"tool_reference","tool_name":"NotebookEdit"},{"type":"tool_reference","tool_name":"DeferredToolPlaceholder"}]}]}]`
	tests := []struct {
		name, messages, extra string
		wantTools             []string
		wantChoice            any // nil = absent
		wantParallel          any
	}{
		{"plain", `[{"role":"user","content":"hi"}]`, `,"tools":[` + read + `]`, []string{"Read"}, nil, nil},
		{"deferred hidden, placeholder and server tools dropped", `[{"role":"user","content":"hi"}]`, `,"tools":[` + read + `,` + deferred + `,` + placeholder + `,` + server + `]`, []string{"Read"}, nil, nil},
		{"deferred exposed once referenced", refMsg, `,"tools":[` + read + `,` + deferred + `,` + placeholder + `]`, []string{"Read", "NotebookEdit"}, nil, nil},
		{"only placeholder: no tools, no tool_choice", `[{"role":"user","content":"hi"}]`, `,"tools":[` + placeholder + `],"tool_choice":{"type":"any"}`, nil, nil, nil},
		{"auto", `[{"role":"user","content":"hi"}]`, `,"tools":[` + read + `],"tool_choice":{"type":"auto"}`, []string{"Read"}, "auto", nil},
		{"any", `[{"role":"user","content":"hi"}]`, `,"tools":[` + read + `],"tool_choice":{"type":"any","disable_parallel_tool_use":true}`, []string{"Read"}, "required", false},
		{"tool", `[{"role":"user","content":"hi"}]`, `,"tools":[` + read + `],"tool_choice":{"type":"tool","name":"Read"}`, []string{"Read"}, map[string]any{"type": "function", "name": "Read"}, nil},
		{"none", `[{"role":"user","content":"hi"}]`, `,"tools":[` + read + `],"tool_choice":{"type":"none"}`, []string{"Read"}, "none", nil},
		{"compaction forces none", `[{"role":"user","content":"Summarise. CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\nblah\nREMINDER: Do NOT call any tools. Respond with plain text only."}]`,
			`,"tools":[` + read + `,{"name":"StructuredOutput","input_schema":{"type":"object"}}],"tool_choice":{"type":"auto"}`, []string{"Read", "StructuredOutput"}, "none", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			turn := translate(t, `{"model":"gpt-5.5","max_tokens":1,"messages":`+tt.messages+tt.extra+`}`, Options{})
			f := frameOf(t, turn)
			var names []string
			if tools, ok := f["tools"].([]any); ok {
				for _, tl := range tools {
					m := tl.(map[string]any)
					if m["type"] != "function" || m["parameters"] == nil {
						t.Errorf("tool shape %v", m)
					}
					names = append(names, m["name"].(string))
				}
			} else if _, present := f["tools"]; present {
				t.Errorf("tools = %v", f["tools"])
			}
			if !reflect.DeepEqual(names, tt.wantTools) {
				t.Errorf("tools = %v, want %v", names, tt.wantTools)
			}
			if !reflect.DeepEqual(f["tool_choice"], tt.wantChoice) {
				t.Errorf("tool_choice = %v, want %v", f["tool_choice"], tt.wantChoice)
			}
			if !reflect.DeepEqual(f["parallel_tool_calls"], tt.wantParallel) {
				t.Errorf("parallel_tool_calls = %v, want %v", f["parallel_tool_calls"], tt.wantParallel)
			}
		})
	}
}

func TestEffort(t *testing.T) {
	tests := []struct {
		name, model, extra string
		want               string // effort sent; "" = no reasoning object
		summary            bool
	}{
		{"output_config", "gpt-5.5", `,"output_config":{"effort":"medium"}`, "medium", true},
		{"output_config wins over budget", "gpt-5.5", `,"output_config":{"effort":"low"},"thinking":{"type":"enabled","budget_tokens":31999}`, "low", true},
		{"budget 31999 (sonnet-4-5) is high", "claude-sonnet-4-5", `,"thinking":{"type":"enabled","budget_tokens":31999,"display":"updates"}`, "high", true},
		{"budget 4096 is low", "gpt-5.5", `,"thinking":{"type":"enabled","budget_tokens":4096}`, "low", true},
		{"budget 4097 is medium", "gpt-5.5", `,"thinking":{"type":"enabled","budget_tokens":4097}`, "medium", true},
		{"budget 16384 is medium", "gpt-5.5", `,"thinking":{"type":"enabled","budget_tokens":16384}`, "medium", true},
		{"budget 16385 is high", "gpt-5.5", `,"thinking":{"type":"enabled","budget_tokens":16385}`, "high", true},
		{"disabled thinking, no effort", "gpt-5.5", `,"thinking":{"type":"disabled"}`, "", false},
		{"adaptive without effort", "gpt-5.5", `,"thinking":{"type":"adaptive"}`, "", false},
		{"xhigh collapses to high", "gpt-5.5", `,"output_config":{"effort":"xhigh"}`, "high", true},
		{"max dropped below 5.6", "gpt-5.5", `,"output_config":{"effort":"max"}`, "", false},
		{"max passes on 5.6", "gpt-5.6-sol", `,"output_config":{"effort":"max"}`, "max", true},
		{"none on 5.6 has no summary", "gpt-5.6-sol", `,"output_config":{"effort":"none"}`, "none", false},
		{"codex-spark has no summary", "gpt-5.5-codex-spark", `,"output_config":{"effort":"high"}`, "high", false},
		{"plain gpt-5 gets none", "gpt-5", `,"output_config":{"effort":"high"}`, "", false},
		{"gpt-5-codex", "gpt-5-codex", `,"output_config":{"effort":" High "}`, "high", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			turn := translate(t, `{"model":"`+tt.model+`","max_tokens":1,"messages":[{"role":"user","content":"hi"}]`+tt.extra+`}`, Options{})
			f := frameOf(t, turn)
			r, present := f["reasoning"].(map[string]any)
			if tt.want == "" {
				if present || turn.Effort != "" {
					t.Errorf("reasoning = %v, effort %q; want none", f["reasoning"], turn.Effort)
				}
				return
			}
			if !present || r["effort"] != tt.want || turn.Effort != tt.want {
				t.Fatalf("reasoning = %v, want effort %q", f["reasoning"], tt.want)
			}
			if _, has := r["summary"]; has != tt.summary || has && r["summary"] != "detailed" {
				t.Errorf("summary = %v, want present=%v", r["summary"], tt.summary)
			}
		})
	}
}

func TestPromptCacheKey(t *testing.T) {
	const uid = `"metadata":{"user_id":"{\"session_id\":\"4F6C2A9E-1B7D-4C3E-9A21-0D5E8F7B6C11\"}"},`
	tests := []struct {
		name, fields, header, want string
	}{
		{"metadata session id (case-folded)", uid, "27323263-e032-43dc-8884-1be048a27cee", "relay-session-9c7e0441f55a229675fc412b6d233499"},
		{"header when metadata has none", `"metadata":{"user_id":"not json"},`, "27323263-e032-43dc-8884-1be048a27cee", "relay-session-7154e7abc529fab9148de424c1a825b8"},
		{"invalid uuid version ignored", `"metadata":{"user_id":"{\"session_id\":\"4f6c2a9e-1b7d-0c3e-9a21-0d5e8f7b6c11\"}"},`, "27323263-e032-43dc-8884-1be048a27cee", "relay-session-7154e7abc529fab9148de424c1a825b8"},
		{"fallback hash of system and tools", `"system":"You are X.","tools":[{"name":"Read","description":"Read a file","input_schema":{"type":"object"}}],`, "bogus", "relay-ba6b0a2b14ab578f035b0080578fcc67"},
		{"fallback uses stripped system", `"system":[{"type":"text","text":"x-anthropic-billing-header: cch=9;"},{"type":"text","text":"You are X."}],`, "", "relay-10070e49c9465da83bf80446e2ec7ec3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			turn := translate(t, `{`+tt.fields+`"model":"gpt-5.5","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, Options{SessionHeader: tt.header})
			if turn.PromptCacheKey != tt.want {
				t.Errorf("key = %q, want %q", turn.PromptCacheKey, tt.want)
			}
		})
	}
}

func TestModelEchoAndResolution(t *testing.T) {
	turn := translate(t, `{"model":"claude-opus-5-5","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, Options{})
	if turn.Model != "gpt-5.5" || turn.RequestedModel != "claude-opus-5-5" || turn.ContextWindow != 258400 {
		t.Errorf("turn model %q requested %q window %d", turn.Model, turn.RequestedModel, turn.ContextWindow)
	}
	models, err := ParseModelAliases("claude-opus-*=gpt-5.6-sol")
	if err != nil {
		t.Fatal(err)
	}
	turn = translate(t, `{"model":"claude-opus-5-5[1m]","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, Options{Models: models})
	if turn.Model != "gpt-5.6-sol" || frameOf(t, turn)["model"] != "gpt-5.6-sol" || turn.RequestedModel != "claude-opus-5-5[1m]" {
		t.Errorf("model %q requested %q", turn.Model, turn.RequestedModel)
	}
}

// The response's output, echoed back by the client in its next request,
// translates to the same canonical items the stream reported: the
// continuation prefix matches (docs/pool.md §3).
func TestEchoRoundTripMatchesOutputItems(t *testing.T) {
	s, rec, _ := runFrames(t, &Turn{RequestedModel: "gpt-5.6-sol"}, spec16Frames)
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	c := NewCollector()
	for _, e := range rec.events {
		n, d := splitEvent(e)
		if err := c.WriteEvent(n, []byte(d)); err != nil {
			t.Fatalf("WriteEvent(%s): %v", n, err)
		}
	}
	msg, err := c.Message()
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		t.Fatalf("collected message %s: %v", msg, err)
	}
	body := `{"model":"gpt-5.6-sol","max_tokens":1,"messages":[{"role":"user","content":"Say hi"},{"role":"assistant","content":` + string(m.Content) + `},{"role":"user","content":"Read README.md"}]}`
	turn := translate(t, body, Options{})
	if len(turn.Input) != 4 {
		t.Fatalf("input has %d items:\n%s", len(turn.Input), joinRaw(turn.Input))
	}
	out := s.OutputItems()
	for i, item := range out {
		c, err := CanonicalItem(turn.Input[1+i])
		if err != nil {
			t.Fatal(err)
		}
		if string(c) != string(item) {
			t.Errorf("echo item %d\n got %s\nwant %s", i, c, item)
		}
	}
	if !strings.Contains(string(turn.Input[1]), `"summary":[{"text":"Greeting the user.","type":"summary_text"}]`) {
		t.Errorf("reasoning item sent upstream lost its summary: %s", turn.Input[1])
	}
}

func TestInputItemsAreCanonical(t *testing.T) {
	turn := translate(t, `{"model":"gpt-5.5","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"<a & b>"},{"type":"tool_result","tool_use_id":"x","content":"y"}]},{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"c","name":"n","input":{"b":1,"a":2}}]},{"role":"system","content":"s"}]}`, Options{})
	for i, it := range turn.Input {
		c, err := CanonicalItem(it)
		if err != nil {
			t.Fatal(err)
		}
		if string(c) != string(it) {
			t.Errorf("item %d not canonical:\n got %s\ncanon %s", i, it, c)
		}
	}
}

func TestLiteAndServiceTier(t *testing.T) {
	turn := translate(t, `{"model":"gpt-5.6-luna","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"output_config":{"effort":"high"}}`, Options{ServiceTier: " Fast "})
	f := frameOf(t, turn)
	if !turn.Lite || f["parallel_tool_calls"] != false || f["service_tier"] != "priority" {
		t.Errorf("lite=%v frame %v", turn.Lite, f)
	}
	if want := map[string]any{"effort": "high", "summary": "detailed", "context": "all_turns"}; !reflect.DeepEqual(f["reasoning"], want) {
		t.Errorf("reasoning %v", f["reasoning"])
	}
	// Lite without effort still gets a reasoning object; tools with
	// disable_parallel_tool_use do not duplicate the field.
	turn = translate(t, `{"model":"gpt-5.6-luna","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"a","input_schema":{}}],"tool_choice":{"type":"auto","disable_parallel_tool_use":true}}`, Options{ServiceTier: "bogus"})
	frame, _ := turn.CreateFrame("", nil)
	if strings.Count(string(frame), `"parallel_tool_calls"`) != 1 || !strings.Contains(string(frame), `"reasoning":{"context":"all_turns"}`) || strings.Contains(string(frame), "service_tier") {
		t.Errorf("frame %s", frame)
	}
	for in, want := range map[string]string{"fast": "priority", "PRIORITY": "priority", "flex": "flex", "auto": "auto", "default": "default", "": ""} {
		if got, err := ParseServiceTier(in); err != nil || got != want {
			t.Errorf("ParseServiceTier(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseServiceTier("turbo"); err == nil || !strings.Contains(err.Error(), "choices are") {
		t.Errorf("ParseServiceTier(turbo) err = %v", err)
	}
}
