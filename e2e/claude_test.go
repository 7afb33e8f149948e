package e2e

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/clienttest"
)

// claudeTimeout bounds one Claude Code run; a healthy case takes 2-6 s.
const claudeTimeout = 90 * time.Second

// upstreamModel is what every model name of these cases resolves to: gpt-5.5
// passes through, claude-* names map to it by the default alias table.
const upstreamModel = "gpt-5.5"

// runClaude runs the pinned Claude Code (bin, from clienttest.ClaudeCode,
// which each test calls before it builds its stack: under CI a missing
// client fails there, skips otherwise) once against st with prompt. Claude
// Code's own retries are off (CLAUDE_CODE_MAX_RETRIES=0), so a failing hop
// shows up as a failed run and not as a slow, retried success. Set
// E2E_DUMP=1 to log every stdout line.
func runClaude(t *testing.T, bin string, st *stack, model, prompt string, extraArgs ...string) clienttest.ClaudeResult {
	t.Helper()
	res := clienttest.RunClaude(t.Context(), t, bin, clienttest.ClaudeRun{
		BaseURL:   st.baseURL,
		Model:     model,
		Prompt:    prompt,
		WorkDir:   t.TempDir(),
		ExtraArgs: extraArgs,
		ExtraEnv:  []string{"CLAUDE_CODE_MAX_RETRIES=0"},
		Timeout:   claudeTimeout,
	})
	if os.Getenv("E2E_DUMP") != "" {
		for _, l := range res.Lines {
			t.Logf("claude stdout: %s", compact(l))
		}
	}
	return res
}

// requireSuccess stops t unless Claude Code exited 0 with a successful
// result line.
func requireSuccess(t *testing.T, res clienttest.ClaudeResult) {
	t.Helper()
	if res.ExitCode != 0 || res.IsError() {
		t.Fatalf("claude exit %d, is_error %v, result line %s\nstderr:\n%s", res.ExitCode, res.IsError(), compact(res.Result), res.Stderr)
	}
}

// checkMessagesRequests checks that Claude Code sent nothing but exactly
// want streaming POST /v1/messages?beta=true requests for model, every one
// answered 200 (no error, no retry, no non-streaming fallback), and returns
// their bodies (nil when the stack has no request recorder).
func checkMessagesRequests(t *testing.T, st *stack, model string, want int) []map[string]any {
	t.Helper()
	if st.requests == nil {
		return nil
	}
	for _, r := range st.requests.all() {
		if r.Method != http.MethodPost || r.Path != "/v1/messages" {
			t.Errorf("Claude Code sent %s %s (answered %d); with nonessential traffic off only POST /v1/messages is expected", r.Method, r.Path, r.Status)
		}
	}
	reqs, bodies := st.requests.messages(t)
	if len(reqs) != want {
		t.Fatalf("Claude Code sent %d POST /v1/messages, want %d (a retry or a non-streaming fallback means a hop failed)", len(reqs), want)
	}
	for i, r := range reqs {
		if r.RawQuery != "beta=true" {
			t.Errorf("request %d: query %q, want %q", i, r.RawQuery, "beta=true")
		}
		if r.Status != http.StatusOK {
			t.Errorf("request %d: answered %d, want 200", i, r.Status)
		}
		if bodies[i]["stream"] != true {
			t.Errorf("request %d: stream = %v, want true", i, bodies[i]["stream"])
		}
		if got := str(bodies[i], "model"); got != model {
			t.Errorf("request %d: model %q, want %q", i, got, model)
		}
	}
	return bodies
}

// checkSimStats checks the emulator's counters after turns turns: one
// response per turn, all completed, no error frame, every upgrade made by
// the data plane's dialer with the right account (none refused).
func checkSimStats(t *testing.T, st *stack, turns int) {
	t.Helper()
	got := st.simStats(t)
	sockets := turns // one socket per turn unless the recorder says otherwise
	if st.upstream != nil {
		sockets = len(st.upstream.snapshot())
	}
	if got.Upgrades != int64(sockets) || got.UpgradesByAccount[simAccount] != int64(sockets) {
		t.Errorf("sim upgrades = %d (by account %v), want %d for %s (one per upstream socket)", got.Upgrades, got.UpgradesByAccount, sockets, simAccount)
	}
	if got.Upgrade401s+got.Upgrade400s+got.Upgrade403s+got.Upgrade5xxs != 0 {
		t.Errorf("sim refused upgrades: 401s %d, 400s %d, 403s %d, 5xxs %d; want none", got.Upgrade401s, got.Upgrade400s, got.Upgrade403s, got.Upgrade5xxs)
	}
	if got.Responses != int64(turns) || got.CompletedResponses != int64(turns) || got.Prewarms != 0 {
		t.Errorf("sim responses %d, completed %d, prewarms %d; want %d, %d, 0", got.Responses, got.CompletedResponses, got.Prewarms, turns, turns)
	}
	if len(got.Errors) != 0 || got.PreviousResponseNotFound != 0 {
		t.Errorf("sim errors %v, previous_response_not_found %d; want none", got.Errors, got.PreviousResponseNotFound)
	}
}

// streamText joins the text of the delta events of type deltaType
// (text_delta, thinking_delta, …) under key, and counts them.
func streamText(evs []map[string]any, deltaType, key string) (string, int) {
	var b strings.Builder
	n := 0
	for _, ev := range ofType(evs, "content_block_delta") {
		if str(ev, "delta", "type") == deltaType {
			b.WriteString(str(ev, "delta", key))
			n++
		}
	}
	return b.String(), n
}

// contentBlocks returns the content blocks of the stream-json lines of
// type lineType ("assistant" or "user") whose type is blockType.
func contentBlocks(lines []map[string]any, lineType, blockType string) []map[string]any {
	var out []map[string]any
	for _, l := range ofType(lines, lineType) {
		out = append(out, ofType(list(l, "message", "content"), blockType)...)
	}
	return out
}

// requireContinuation asserts that a two-turn exchange ran on ONE upstream
// socket, the second response.create continuing the first response with
// previous_response_id and sending only the new items. It returns the two
// turns.
func requireContinuation(t *testing.T, st *stack) []socketLog {
	t.Helper()
	if n := len(st.upstream.snapshot()); n != 1 {
		t.Fatalf("data plane opened %d upstream sockets for two turns, want 1 (the pool keeps the conversation's socket)", n)
	}
	turns := st.upstream.turns()
	if len(turns) != 2 {
		t.Fatalf("data plane sent %d response.create frames, want 2", len(turns))
	}
	var firstID string
	for _, ev := range ofType(objs(t, turns[0].events), "response.completed") {
		firstID = str(ev, "response", "id")
	}
	second := obj(t, turns[1].sent[0])
	if prev := str(second, "previous_response_id"); prev == "" || prev != firstID {
		t.Errorf("second response.create has previous_response_id %q, want the first response %q", prev, firstID)
	}
	in1, out1 := upstreamItems(t, turns[0])
	if in2 := list(second, "input"); len(in2) >= len(in1)+len(out1) {
		t.Errorf("second response.create sent %d input items, want only the new ones (fewer than the %d of the whole history)", len(in2), len(in1)+len(out1))
	}
	return turns
}

// conversationInput returns the full input the backend saw for turn i: a
// continuation (previous_response_id) extends turn i-1's input and output
// with the items it sent.
func conversationInput(t *testing.T, turns []socketLog, i int) []map[string]any {
	t.Helper()
	in, _ := upstreamItems(t, turns[i])
	if str(obj(t, turns[i].sent[0]), "previous_response_id") == "" {
		return in
	}
	if i == 0 {
		t.Fatalf("first response.create continues a response")
	}
	_, out := upstreamItems(t, turns[i-1])
	return append(append(conversationInput(t, turns, i-1), out...), in...)
}

// upstreamItems returns the input items of the single response.create
// frame of log s (a socket, or one turn from turns()), and the output items of its response.completed.
func upstreamItems(t *testing.T, s socketLog) (input, output []map[string]any) {
	t.Helper()
	if len(s.sent) != 1 {
		t.Fatalf("data plane sent %d frames on one socket, want 1 response.create", len(s.sent))
	}
	frame := obj(t, s.sent[0])
	if str(frame, "type") != "response.create" || str(frame, "model") != upstreamModel {
		t.Errorf("upstream frame type %q model %q, want response.create for %s", str(frame, "type"), str(frame, "model"), upstreamModel)
	}
	done := ofType(objs(t, s.events), "response.completed")
	if len(done) != 1 {
		t.Fatalf("socket saw %d response.completed events, want 1", len(done))
	}
	return list(frame, "input"), list(done[0], "response", "output")
}

func TestClaudeCodeTextTurn(t *testing.T) {
	// The sim streams the reply cut before each space: 5 deltas.
	const reply = "E2E-TEXT-OK streamed in five pieces"
	tests := []struct {
		name  string
		model string
	}{
		{name: "upstream model name", model: "gpt-5.5"},
		{name: "claude alias", model: "claude-sonnet-4-5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := clienttest.ClaudeCode(t)
			st := newStack(t)
			res := runClaude(t, bin, st, tt.model, "#sim reply "+reply)
			requireSuccess(t, res)
			if got := res.Text(); got != reply {
				t.Errorf("result text = %q, want %q", got, reply)
			}

			evs := res.StreamEvents()
			starts := ofType(evs, "message_start")
			if len(starts) != 1 || str(starts[0], "message", "model") != tt.model {
				t.Errorf("message_start events %s, want one echoing model %q", compact(starts), tt.model)
			}
			text, deltas := streamText(evs, "text_delta", "text")
			if text != reply || deltas < 2 {
				t.Errorf("text_delta events joined = %q in %d deltas, want %q in several deltas", text, deltas, reply)
			}
			stops := ofType(evs, "message_delta")
			if len(stops) != 1 || str(stops[0], "delta", "stop_reason") != "end_turn" {
				t.Errorf("message_delta events %s, want one with stop_reason end_turn", compact(stops))
			}

			checkMessagesRequests(t, st, tt.model, 1)
			if st.upstream != nil {
				sockets := st.upstream.snapshot()
				if len(sockets) != 1 {
					t.Fatalf("data plane opened %d upstream sockets for one turn, want 1", len(sockets))
				}
				// Every upstream delta reached Claude Code as its own
				// text_delta: nothing was buffered into one piece.
				upDeltas := ofType(objs(t, sockets[0].events), "response.output_text.delta")
				if len(upDeltas) != deltas {
					t.Errorf("sim sent %d output_text.delta events, Claude Code saw %d text_delta events; want equal", len(upDeltas), deltas)
				}
				input, _ := upstreamItems(t, sockets[0])
				var sawPrompt bool
				for _, it := range input {
					for _, p := range list(it, "content") {
						if str(it, "role") == "user" && strings.Contains(str(p, "text"), "#sim reply "+reply) {
							sawPrompt = true
						}
					}
				}
				if !sawPrompt {
					t.Errorf("upstream input has no user text with the prompt: %s", compact(input))
				}
			}
			checkSimStats(t, st, 1)
		})
	}
}

func TestClaudeCodeBashToolRoundTrip(t *testing.T) {
	const (
		marker = "e2e-tool-marker"
		model  = "gpt-5.5"
	)
	wantInput := map[string]any{"command": "echo " + marker, "description": "echo"}
	args, err := json.Marshal(wantInput)
	if err != nil {
		t.Fatal(err)
	}
	bin := clienttest.ClaudeCode(t)
	st := newStack(t)
	res := runClaude(t, bin, st, model, "Run the echo command.\n#sim call Bash "+string(args), "--allowedTools", "Bash(echo:*)")
	requireSuccess(t, res)

	// The sim's answer to a function_call_output quotes its first 60
	// characters. Claude Code appends a <system-reminder> to the tool
	// result, so only the start is fixed.
	if want := "Tool result received: " + marker; !strings.HasPrefix(res.Text(), want) {
		t.Errorf("result text = %q, want it to start with %q", res.Text(), want)
	}
	if n, _ := res.Result["num_turns"].(float64); n != 2 {
		t.Errorf("result num_turns = %v, want 2", res.Result["num_turns"])
	}
	if d, _ := res.Result["permission_denials"].([]any); len(d) != 0 {
		t.Errorf("result permission_denials = %s, want none", compact(d))
	}

	// Claude Code saw the tool call, ran it and answered it.
	uses := contentBlocks(res.Lines, "assistant", "tool_use")
	if len(uses) != 1 || str(uses[0], "name") != "Bash" || !reflect.DeepEqual(field(uses[0], "input"), wantInput) {
		t.Fatalf("assistant tool_use blocks %s, want one Bash call with input %s", compact(uses), args)
	}
	useID := str(uses[0], "id")
	results := contentBlocks(res.Lines, "user", "tool_result")
	if len(results) != 1 || str(results[0], "tool_use_id") != useID || results[0]["is_error"] != false ||
		!strings.HasPrefix(str(results[0], "content"), marker) {
		t.Fatalf("user tool_result blocks %s, want one for %q starting with %q, is_error false", compact(results), useID, marker)
	}
	var stdout []string
	for _, l := range ofType(res.Lines, "user") {
		stdout = append(stdout, str(l, "tool_use_result", "stdout"))
	}
	if len(stdout) != 1 || stdout[0] != marker {
		t.Errorf("tool_use_result stdout = %q, want [%q]: Bash did not run the command", stdout, marker)
	}

	// The tool call streamed: a tool_use block start, its input as
	// input_json_delta, stop_reason tool_use.
	evs := res.StreamEvents()
	var toolStarts int
	for _, ev := range ofType(evs, "content_block_start") {
		if str(ev, "content_block", "type") == "tool_use" && str(ev, "content_block", "name") == "Bash" && str(ev, "content_block", "id") == useID {
			toolStarts++
		}
	}
	partial, _ := streamText(evs, "input_json_delta", "partial_json")
	var streamedInput map[string]any
	if err := json.Unmarshal([]byte(partial), &streamedInput); err != nil || !reflect.DeepEqual(streamedInput, wantInput) || toolStarts != 1 {
		t.Errorf("stream: %d tool_use starts for %q, input_json_delta joined %q; want 1 and %s", toolStarts, useID, partial, args)
	}
	var stopReasons []string
	for _, ev := range ofType(evs, "message_delta") {
		stopReasons = append(stopReasons, str(ev, "delta", "stop_reason"))
	}
	if !reflect.DeepEqual(stopReasons, []string{"tool_use", "end_turn"}) {
		t.Errorf("stop reasons %q, want [tool_use end_turn]", stopReasons)
	}

	bodies := checkMessagesRequests(t, st, model, 2)
	if bodies != nil {
		msgs := list(bodies[1], "messages")
		last := msgs[len(msgs)-1]
		tr := ofType(list(last, "content"), "tool_result")
		if str(last, "role") != "user" || len(tr) != 1 || str(tr[0], "tool_use_id") != useID {
			t.Errorf("second request's last message %s, want the user tool_result for %q", compact(last), useID)
		}
	}

	if st.upstream != nil {
		sockets := requireContinuation(t, st)
		_, out1 := upstreamItems(t, sockets[0])
		calls := ofType(out1, "function_call")
		if len(calls) != 1 || str(calls[0], "name") != "Bash" {
			t.Fatalf("first response output %s, want one Bash function_call", compact(out1))
		}
		callID := str(calls[0], "call_id")
		in2 := conversationInput(t, sockets, 1)
		// The history ends with the call and its output, tied by
		// the sim's call_id.
		if len(in2) < 2 {
			t.Fatalf("second upstream input %s, want at least the call and its output", compact(in2))
		}
		call, output := in2[len(in2)-2], in2[len(in2)-1]
		var callArgs map[string]any
		_ = json.Unmarshal([]byte(str(call, "arguments")), &callArgs)
		if str(call, "type") != "function_call" || str(call, "call_id") != callID || str(call, "name") != "Bash" || !reflect.DeepEqual(callArgs, wantInput) {
			t.Errorf("second upstream input's call item %s, want function_call %s Bash %s", compact(call), callID, args)
		}
		if str(output, "type") != "function_call_output" || str(output, "call_id") != callID || !strings.HasPrefix(str(output, "output"), marker) {
			t.Errorf("second upstream input's last item %s, want function_call_output for %s starting with %q", compact(output), callID, marker)
		}
	}
	checkSimStats(t, st, 2)
}

func TestClaudeCodeThinkingSignatureRoundTrip(t *testing.T) {
	const (
		marker  = "e2e-thinking-marker"
		summary = "thinking-part-one"
		model   = "claude-sonnet-4-5"
	)
	bin := clienttest.ClaudeCode(t)
	st := newStack(t)
	prompt := "Think, then run the echo command.\n#sim reasoning " + summary +
		"\n#sim call Bash {\"command\":\"echo " + marker + "\",\"description\":\"echo\"}"
	res := runClaude(t, bin, st, model, prompt, "--allowedTools", "Bash(echo:*)")
	requireSuccess(t, res)
	if want := "Tool result received: " + marker; !strings.HasPrefix(res.Text(), want) {
		t.Errorf("result text = %q, want it to start with %q", res.Text(), want)
	}

	// Hop 1: the emulator's reasoning item reached Claude Code as a
	// thinking block, streamed as thinking_delta + one signature_delta
	// carrying the item's encrypted_content.
	evs := res.StreamEvents()
	thinking, _ := streamText(evs, "thinking_delta", "thinking")
	signature, sigDeltas := streamText(evs, "signature_delta", "signature")
	if thinking != summary || sigDeltas != 1 {
		t.Errorf("stream: thinking %q in %d signature_delta events; want %q in 1", thinking, sigDeltas, summary)
	}
	blocks := contentBlocks(res.Lines, "assistant", "thinking")
	if len(blocks) != 1 || str(blocks[0], "thinking") != summary || str(blocks[0], "signature") != signature {
		t.Errorf("assistant thinking blocks %s, want one with thinking %q and the streamed signature %q", compact(blocks), summary, signature)
	}
	// The emulator's blob is base64("sim-reasoning:" + response id + ":" +
	// output index): the reasoning item is output 0 of the first response.
	decoded, err := base64.StdEncoding.DecodeString(signature)
	respID, ok := strings.CutPrefix(string(decoded), "sim-reasoning:")
	respID, ok0 := strings.CutSuffix(respID, ":0")
	if err != nil || !ok || !ok0 || !strings.HasPrefix(respID, "resp_") {
		t.Fatalf("signature %q decodes to %q (err %v), want the emulator's sim-reasoning:resp_…:0 blob", signature, decoded, err)
	}

	if st.upstream != nil {
		sockets := requireContinuation(t, st)
		var completedID string
		for _, ev := range ofType(objs(t, sockets[0].events), "response.completed") {
			completedID = str(ev, "response", "id")
		}
		_, out1 := upstreamItems(t, sockets[0])
		reasoning := ofType(out1, "reasoning")
		if completedID != respID || len(reasoning) != 1 || str(reasoning[0], "encrypted_content") != signature {
			t.Errorf("first response %q output %s, want response %q with one reasoning item whose encrypted_content is %q", completedID, compact(out1), respID, signature)
		}
	}

	// Hop 2: Claude Code sent the block back, signature unchanged, before
	// its tool_use, and the second turn succeeded (no 400, no
	// beta-stripping resend).
	if bodies := checkMessagesRequests(t, st, model, 2); bodies != nil {
		var echoed []map[string]any
		for _, m := range list(bodies[1], "messages") {
			if str(m, "role") == "assistant" {
				echoed = append(echoed, list(m, "content")...)
			}
		}
		if len(echoed) != 2 || str(echoed[0], "type") != "thinking" || str(echoed[0], "signature") != signature ||
			str(echoed[0], "thinking") != summary || str(echoed[1], "type") != "tool_use" {
			t.Errorf("second request's assistant content %s, want [thinking(signature %q), tool_use]", compact(echoed), signature)
		}
	}

	// Hop 3: the data plane replayed it upstream as the same reasoning
	// item, right before the function call it preceded.
	if st.upstream != nil {
		in2 := conversationInput(t, st.upstream.turns(), 1)
		var kinds []string
		var replayed map[string]any
		for _, it := range in2 {
			switch typ := str(it, "type"); typ {
			case "", "message":
			default:
				kinds = append(kinds, typ)
			}
			if str(it, "type") == "reasoning" {
				replayed = it
			}
		}
		if want := []string{"reasoning", "function_call", "function_call_output"}; !reflect.DeepEqual(kinds, want) {
			t.Errorf("non-message items of the second upstream input = %q, want %q", kinds, want)
		}
		if str(replayed, "encrypted_content") != signature {
			t.Errorf("replayed reasoning item %s, want encrypted_content %q", compact(replayed), signature)
		}
		summaries := list(replayed, "summary")
		if len(summaries) != 1 || str(summaries[0], "text") != summary {
			t.Errorf("replayed reasoning summary %s, want [%q]", compact(summaries), summary)
		}
	}
	checkSimStats(t, st, 2)
}

// TestDataPlaneHTTPSanity covers the two non-turn endpoints Claude Code may
// call: the preconnect HEAD (with nonessential traffic on) and count_tokens
// (/context), over plain HTTP; no client needed.
func TestDataPlaneHTTPSanity(t *testing.T) {
	st := newStack(t)

	for _, path := range []string{"/api/hello", "/"} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodHead, st.baseURL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("User-Agent", "Bun/1.4.6")
		resp, err := st.client.Do(req)
		if err != nil {
			t.Fatalf("HEAD %s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("HEAD %s = %d, want 200", path, resp.StatusCode)
		}
	}

	countTokens := func(text string) int {
		t.Helper()
		body, err := json.Marshal(map[string]any{
			"model":    "claude-sonnet-4-5",
			"messages": []any{map[string]any{"role": "user", "content": text}},
		})
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, st.baseURL+"/v1/messages/count_tokens?beta=true", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("x-api-key", "test-key")
		resp, err := st.client.Do(req)
		if err != nil {
			t.Fatalf("count_tokens: %v", err)
		}
		defer resp.Body.Close()
		var got map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("count_tokens: status %d, body %v, decode err %v; want 200 {\"input_tokens\":N}", resp.StatusCode, got, err)
		}
		if keys := strings.Join(slices.Sorted(maps.Keys(got)), ","); keys != "input_tokens" {
			t.Errorf("count_tokens keys = %s, want input_tokens only", keys)
		}
		n, _ := got["input_tokens"].(float64)
		return int(n)
	}
	short := countTokens("hi")
	long := countTokens(strings.Repeat("count these words please ", 400))
	if short <= 0 || long <= short {
		t.Errorf("count_tokens: %d for a 2-char message, %d for a 9600-char one; want 0 < short < long", short, long)
	}
	// About 4 characters per token for English text: the long message alone
	// is ~2400 tokens; the estimate must be in that range, not off by 10x.
	if long < 1000 || long > 10000 {
		t.Errorf("count_tokens for 9600 characters = %d, want between 1000 and 10000", long)
	}

	if got := st.simStats(t); got.Upgrades != 0 || got.Responses != 0 {
		t.Errorf("sim upgrades %d, responses %d after HEAD and count_tokens; want 0 (no upstream traffic)", got.Upgrades, got.Responses)
	}
}
