package e2e

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/clienttest"
)

// matrixTimeout bounds one client of the matrix. opencode retries a 429 five times on its
// own schedule (2, 4, 8, 16, 32 s, plus jitter) before it shows the error: about 80 s.
const matrixTimeout = 3 * time.Minute

// num is field as a number (0 when absent or not a number).
func num(m map[string]any, keys ...string) float64 {
	n, _ := field(m, keys...).(float64)
	return n
}

// nodeCase runs script once and returns what each case printed; t fails when the script
// did not end cleanly or printed nothing for a case of want.
func nodeCases(t *testing.T, script, libs string, st *stack, env []string, want ...string) clienttest.NodeResult {
	t.Helper()
	res := clienttest.RunNode(t.Context(), t, clienttest.NodeRun{Script: "testdata/clients/" + script, Libraries: libs,
		BaseURL: st.baseURL, ExtraEnv: env, Timeout: matrixTimeout, Locked: true})
	if res.ExitCode != 0 || len(res.Other) != 0 {
		t.Errorf("node %s: exit %d, other output %q\nstderr:\n%s", script, res.ExitCode, res.Other, res.Stderr)
	}
	for _, c := range want {
		if res.Case(c) == nil {
			t.Errorf("node %s printed nothing for case %q:\n%s\nstderr:\n%s", script, c, compact(res.Lines), res.Stderr)
		}
	}
	return res
}

// TestClientMatrix drives the clients people use besides Claude Code, pinned like it, as
// their users drive them, side by side through one data plane in front of clodex-sim: the
// Vercel AI SDK (ai 7 + @ai-sdk/anthropic 4.0), LangChain (@langchain/anthropic 1.5), the
// Claude Agent SDK 0.3 (with the pinned Claude Code) and opencode 1.18. Each asserts what
// its user sees: the text, the object, the usage, the error.
func TestClientMatrix(t *testing.T) {
	libs := clienttest.NodeLibraries(t)
	claude := clienttest.ClaudeCode(t)
	opencode := clienttest.Opencode(t)
	st := newStack(t)
	// One hold of the machine-wide client lock for the whole matrix: its clients run
	// side by side (they mostly wait on each other's sockets and opencode's retries).
	unlock := clienttest.LockClientRun(t.Context(), t)
	defer unlock()

	t.Run("clients", func(t *testing.T) {
		t.Run("Vercel AI SDK", func(t *testing.T) {
			t.Parallel()
			testAISDK(t, libs, st)
		})
		t.Run("LangChain", func(t *testing.T) {
			t.Parallel()
			testLangChain(t, libs, st)
		})
		t.Run("Claude Agent SDK", func(t *testing.T) {
			t.Parallel()
			testAgentSDK(t, libs, claude, st)
		})
		t.Run("opencode usage limit", func(t *testing.T) {
			t.Parallel()
			testOpencodeUsageLimit(t, opencode, st)
		})
	})
}

func testAISDK(t *testing.T, libs string, st *stack) {
	res := nodeCases(t, "aisdk.mjs", libs, st, nil, "generateText", "streamText", "tools", "Output.object", "usage limit")
	if c := res.Case("generateText"); str(c, "text") != "Hello from the AI SDK" || str(c, "finishReason") != "stop" ||
		num(c, "usage", "inputTokens") <= 0 || num(c, "usage", "outputTokens") <= 0 {
		t.Errorf("generateText: %s; want the reply, finishReason stop and the usage", compact(c))
	}
	if c := res.Case("streamText"); c != nil {
		chunks, _ := c["chunks"].([]any)
		var text strings.Builder
		for _, ch := range chunks {
			s, _ := ch.(string)
			text.WriteString(s)
		}
		if text.String() != "streamed to the AI SDK in pieces" || len(chunks) < 2 || num(c, "usage", "outputTokens") <= 0 {
			t.Errorf("streamText: %s; want the reply in several chunks and the usage", compact(c))
		}
	}
	if c := res.Case("tools"); !reflect.DeepEqual(c["calls"], []any{"Paris"}) || num(c, "steps") != 2 ||
		str(c, "text") != "Tool result received: sunny in Paris" {
		t.Errorf("tools: %s; want one weather call for Paris, then the answer to its result", compact(c))
	}
	// Output.object in its default mode puts the schema in output_config.format: the
	// object the user gets is the emulator's instance of it.
	want := map[string]any{"city": "clodex-sim", "population": 0.0, "tags": []any{}}
	if c := res.Case("Output.object"); !reflect.DeepEqual(c["object"], want) {
		t.Errorf("Output.object: %s; want the object %s", compact(c), compact(want))
	}
	if st.upstream != nil && !sentFormat(t, st, `"city":{"type":"string"}`) {
		t.Errorf("no response.create carried Output.object's schema as text.format")
	}
	// A usage limit hours away: the AI SDK ignores x-should-retry and retries on its own
	// schedule (no retry-after to wait out), then shows the message.
	c := res.Case("usage limit")
	msg := str(c, "error", "message")
	headers, _ := field(c, "error", "headers").(map[string]any)
	reset, _ := headers["anthropic-ratelimit-requests-reset"].(string)
	_, perr := time.Parse(time.RFC3339, reset)
	if num(c, "error", "statusCode") != 429 || !strings.Contains(msg, "The ChatGPT plan's usage limit was reached (usage_limit_reached, pro plan); it resets in 2h30m (at "+reset+")") ||
		headers["x-should-retry"] != "false" || headers["retry-after"] != nil || perr != nil {
		t.Errorf("usage limit: %s; want a 429 error saying when the plan resets, x-should-retry false, no retry-after, the reset in anthropic-ratelimit-requests-reset", compact(c))
	}
}

func testLangChain(t *testing.T, libs string, st *stack) {
	res := nodeCases(t, "langchain.mjs", libs, st, nil, "stream with usage", "withStructuredOutput")
	c := res.Case("stream with usage")
	// LangChain reads the input side of the usage only from message_start.
	if str(c, "first", "text") != "one two three, streamed through LangChain" || num(c, "first", "usage", "input_tokens") <= 0 ||
		num(c, "first", "usage", "output_tokens") <= 0 {
		t.Errorf("stream, first turn: %s; want the reply and input and output tokens", compact(field(c, "first")))
	}
	if str(c, "second", "text") != "four five" || num(c, "second", "usage", "input_token_details", "cache_read") <= 0 {
		t.Errorf("stream, continued turn: %s; want the reply and the cached prefix in cache_read", compact(field(c, "second")))
	}
	if c := res.Case("withStructuredOutput"); !reflect.DeepEqual(c["object"], map[string]any{"answer": "clodex-sim", "confidence": 0.0}) {
		t.Errorf("withStructuredOutput: %s; want the object {answer, confidence}", compact(c))
	}
	if st.upstream != nil && !sentFormat(t, st, `"confidence":{"type":"number"}`) {
		t.Errorf("no response.create carried withStructuredOutput's schema as text.format")
	}
}

func testAgentSDK(t *testing.T, libs, claude string, st *stack) {
	res := nodeCases(t, "agentsdk.mjs", libs, st, []string{
		"CLAUDE_CODE_EXECUTABLE=" + claude, "DISABLE_AUTOUPDATER=1", "DISABLE_TELEMETRY=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "CLAUDE_CODE_MAX_RETRIES=0",
	}, "tool loop", "resume")
	loop := res.Case("tool loop")
	wantTool := []any{map[string]any{"name": "Bash", "input": map[string]any{"command": "echo agent-sdk-marker", "description": "echo"}}}
	results, _ := loop["toolResults"].([]any)
	out, _ := func() (string, bool) {
		if len(results) != 1 {
			return "", false
		}
		s, ok := results[0].(string)
		return s, ok
	}()
	if !reflect.DeepEqual(loop["tools"], wantTool) || !strings.HasPrefix(out, "agent-sdk-marker") || str(loop, "result", "subtype") != "success" ||
		field(loop, "result", "is_error") != false || num(loop, "result", "num_turns") != 2 ||
		!strings.HasPrefix(str(loop, "result", "result"), "Tool result received: agent-sdk-marker") {
		t.Errorf("tool loop: %s; want one Bash echo run by Claude Code and the answer to its output in 2 turns", compact(loop))
	}
	resumed := res.Case("resume")
	if sid := str(loop, "result", "session_id"); sid == "" || str(resumed, "result", "session_id") != sid ||
		str(resumed, "result", "result") != "It printed agent-sdk-marker." || field(resumed, "result", "is_error") != false {
		t.Errorf("resume: %s; want the reply in the same session %q", compact(resumed), sid)
	}
	// The resumed turn carried the session's history: the tool call of the loop.
	if st.requests != nil {
		_, bodies := st.requests.messages(t)
		var found bool
		for _, b := range bodies {
			if msgs, _ := json.Marshal(b["messages"]); strings.Contains(string(msgs), "What did the command print?") {
				found = strings.Contains(string(msgs), `"command":"echo agent-sdk-marker"`)
			}
		}
		if !found {
			t.Errorf("no resumed request carried the loop's tool call in its history")
		}
	}
}

func testOpencodeUsageLimit(t *testing.T, bin string, st *stack) {
	res := clienttest.RunOpencode(t.Context(), t, bin, clienttest.OpencodeRun{BaseURL: st.baseURL,
		Prompt: "Please go on.\n#sim usage-limit 9000 pro\nThanks.", Timeout: matrixTimeout, Locked: true})
	// With retry-after set to the reset (9000 s) opencode waited in silence; now it ends,
	// after its own retries, with the message.
	const want = "The ChatGPT plan's usage limit was reached (usage_limit_reached, pro plan); it resets in 2h30m (at "
	if res.ExitCode == 0 || !strings.Contains(res.Stdout+res.Stderr, want) {
		t.Errorf("opencode run: exit %d, output:\n%s\n%s\nwant a failure showing %q", res.ExitCode, res.Stdout, tail(res.Stderr, 20), want)
	}
}

// sentFormat reports whether a response.create frame carried a json_schema text.format
// containing schemaPart.
func sentFormat(t *testing.T, st *stack, schemaPart string) bool {
	t.Helper()
	for _, turn := range st.upstream.turns() {
		f := obj(t, turn.sent[0])
		format, _ := field(f, "text", "format").(map[string]any)
		b, _ := json.Marshal(format["schema"])
		if format["type"] == "json_schema" && format["strict"] == true && strings.Contains(string(b), schemaPart) {
			return true
		}
	}
	return false
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
