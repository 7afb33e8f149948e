package codexsim

import (
	"bufio"
	"encoding/json"
	"net/http"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/clodex/clodex/internal/captures"
)

// fixtureDir is the folder of the captured Codex CLI traffic in package
// captures.
const fixtureDir = "codex"

func readFixture(t *testing.T, name string) map[string]any {
	t.Helper()
	b, err := captures.ReadFile(path.Join(fixtureDir, name))
	if err != nil {
		t.Fatalf("read fixture: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("parse fixture %s: %v", name, err)
	}
	return m
}

// capturedTypes reads the event types of a captured SSE answer.
func capturedTypes(t *testing.T, name string) []string {
	t.Helper()
	f, err := captures.FS.Open(path.Join(fixtureDir, name))
	if err != nil {
		t.Fatalf("open fixture: %v", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if typ, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			out = append(out, typ)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no events in %s", name)
	}
	return out
}

// upgradeHeaders turns captured upgrade headers into a dial header set,
// with the redacted credentials replaced by the test's.
func upgradeHeaders(t *testing.T, captured map[string]any, account bool) http.Header {
	t.Helper()
	h := http.Header{}
	for k, v := range captured {
		switch strings.ToLower(k) {
		case "host", "connection", "upgrade", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-key", "authorization", "chatgpt-account-id":
			continue
		}
		switch v := v.(type) {
		case string:
			h.Set(k, v)
		default:
			b, _ := json.Marshal(v)
			h.Set(k, string(b))
		}
	}
	if h.Get("openai-beta") != BetaHeaderValue {
		t.Fatalf("captured upgrade has openai-beta %q, want %q", h.Get("openai-beta"), BetaHeaderValue)
	}
	h.Set("Authorization", "Bearer "+testToken)
	if account {
		h.Set("chatgpt-account-id", testAccount)
	}
	return h
}

func frameOf(t *testing.T, session map[string]any, key string) map[string]any {
	t.Helper()
	rec, ok := session[key].(map[string]any)
	if !ok {
		t.Fatalf("fixture has no %s", key)
	}
	f, ok := rec["frame"].(map[string]any)
	if !ok {
		t.Fatalf("fixture %s has no frame", key)
	}
	return f
}

// TestReplayWebSocketSessions replays the captured Codex CLI 0.171.0
// sessions (prewarm, turn, tool-result continuation) and checks the emulator
// answers as the captures show.
func TestReplayWebSocketSessions(t *testing.T) {
	textSeq := collapse(capturedTypes(t, "codex-stub-sse-text-reply.txt"))
	callSeq := collapse(capturedTypes(t, "codex-stub-sse-function-call-reply.txt"))
	tests := []struct {
		fixture string
		path    string
		account bool
	}{
		{"codex-0.171.0-apikey-websocket-session.json", APIKeyPath, false},
		{"codex-0.171.0-chatgpt-websocket-session.json", ChatGPTPath, true},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			session := readFixture(t, tt.fixture)
			up := session["upgrade"].(map[string]any)
			if got := up["url"]; got != tt.path {
				t.Fatalf("captured upgrade url = %v, want %s", got, tt.path)
			}
			prewarm := frameOf(t, session, "frame_prewarm")
			turn := frameOf(t, session, "frame_turn")
			toolOut := frameOf(t, session, "frame_tool_output")
			if s, ok := turn["tools"].(string); ok && strings.Contains(s, "identical to frame_prewarm") {
				turn["tools"] = prewarm["tools"]
			}

			for _, withCall := range []bool{false, true} {
				srv, ts := testServer(t, Config{})
				c, status, err := dial(t.Context(), ts, tt.path, upgradeHeaders(t, up["headers"].(map[string]any), tt.account))
				if err != nil {
					t.Fatalf("dial with captured headers: status %d: %v", status, err)
				}
				defer func() { _ = c.CloseNow() }()

				// Frame 1: the prewarm completes with no output.
				if prewarm["generate"] != false {
					t.Fatalf("captured prewarm generate = %v, want false", prewarm["generate"])
				}
				send(t, c, prewarm)
				evs := readResponse(t, c)
				if got, want := collapse(types(evs)), []string{"response.created", "response.completed"}; !slices.Equal(got, want) {
					t.Fatalf("prewarm events = %v, want %v", got, want)
				}
				pre := responseOf(t, last(evs))
				if out := pre["output"].([]any); len(out) != 0 {
					t.Errorf("prewarm output = %v, want empty", out)
				}
				preID := pre["id"].(string)
				if !strings.HasPrefix(preID, "resp_") {
					t.Errorf("response id %q, want resp_ prefix", preID)
				}

				// Frame 2: the turn continues the prewarm with only new input.
				turn := cloneJSON(t, turn)
				turn["previous_response_id"] = preID
				wantSeq := textSeq
				if withCall {
					input := turn["input"].([]any)
					lastMsg := input[len(input)-1].(map[string]any)
					part := lastMsg["content"].([]any)[0].(map[string]any)
					part["text"] = part["text"].(string) + "\n#sim call exec_command {\"cmd\":\"echo hello-from-codex-tool\"}"
					wantSeq = callSeq
				}
				send(t, c, turn)
				evs = readResponse(t, c)
				if got := collapse(types(evs)); !slices.Equal(got, wantSeq) {
					t.Fatalf("turn events = %v\nwant (capture) %v", got, wantSeq)
				}
				if types(evs)[0] != "codex.rate_limits" {
					t.Errorf("first event = %s, want codex.rate_limits", types(evs)[0])
				}
				resp := responseOf(t, last(evs))
				if resp["previous_response_id"] != preID {
					t.Errorf("turn previous_response_id = %v, want %s", resp["previous_response_id"], preID)
				}
				turnID := resp["id"].(string)
				out := resp["output"].([]any)
				if !withCall {
					text := out[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"]
					if text != "Hello from clodex-sim. You said: run echo" {
						t.Errorf("turn reply = %q, want the default reply to \"run echo\"", text)
					}
					continue
				}
				call := out[0].(map[string]any)
				if call["type"] != "function_call" || call["name"] != "exec_command" || call["arguments"] != `{"cmd":"echo hello-from-codex-tool"}` || call["call_id"] != "call_1" {
					t.Errorf("function call item = %v", call)
				}

				// Frame 3: the tool output continues the turn.
				toolOut := cloneJSON(t, toolOut)
				toolOut["previous_response_id"] = turnID
				toolOut["input"].([]any)[0].(map[string]any)["call_id"] = "call_1"
				send(t, c, toolOut)
				evs = readResponse(t, c)
				if got := collapse(types(evs)); !slices.Equal(got, textSeq) {
					t.Fatalf("tool-output turn events = %v\nwant %v", got, textSeq)
				}
				text := responseOf(t, last(evs))["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"].(string)
				if want := "Tool result received: Chunk ID: "; !strings.HasPrefix(text, want) {
					t.Errorf("tool-output reply = %q, want prefix %q", text, want)
				}
				st := srv.Stats()
				if st.Upgrades != 1 || st.Responses != 3 || st.Prewarms != 1 || st.ContinuedResponses != 2 || len(st.Errors) != 0 {
					t.Errorf("stats upgrades=%d responses=%d prewarms=%d continued=%d errors=%v; want 1, 3, 1, 2, none",
						st.Upgrades, st.Responses, st.Prewarms, st.ContinuedResponses, st.Errors)
				}
			}
		})
	}
}

// TestReplayHTTPBodies sends the captured HTTP request bodies as
// response.create frames: every field Codex CLI sends is accepted.
func TestReplayHTTPBodies(t *testing.T) {
	textSeq := collapse(capturedTypes(t, "codex-stub-sse-text-reply.txt"))
	bodies := map[string]map[string]any{
		"apikey-http-request":   readFixture(t, "codex-0.171.0-apikey-http-request.json")["body"].(map[string]any),
		"chatgpt-http-fallback": readFixture(t, "codex-0.171.0-chatgpt-http-fallback.json")["post"].(map[string]any)["body"].(map[string]any),
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			_, ts := testServer(t, Config{})
			c := mustDial(t, ts)
			body["type"] = "response.create"
			send(t, c, body)
			evs := readResponse(t, c)
			if got := collapse(types(evs)); !slices.Equal(got, textSeq) {
				t.Fatalf("events = %v, want %v (last %v)", got, textSeq, last(evs))
			}
			in, cached, _, _, _ := usage(t, last(evs))
			if in <= 0 || cached != 0 {
				t.Errorf("usage input=%d cached=%d, want input > 0 and cached 0 on a fresh socket", in, cached)
			}
		})
	}
}

func cloneJSON(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReplayHTTPToolTurn resends the captured HTTP tool round trip (the
// whole conversation ending with function_call + function_call_output) as
// one response.create on a fresh socket: the emulator answers the tool
// output.
func TestReplayHTTPToolTurn(t *testing.T) {
	textSeq := collapse(capturedTypes(t, "codex-stub-sse-text-reply.txt"))
	body := readFixture(t, "codex-0.171.0-apikey-http-request.json")["body"].(map[string]any)
	tail := readFixture(t, "codex-0.171.0-apikey-http-tool-turn2.json")["turn2_input_tail"].([]any)
	body["input"] = append(body["input"].([]any), tail...)
	body["type"] = "response.create"
	_, ts := testServer(t, Config{})
	c := mustDial(t, ts)
	send(t, c, body)
	evs := readResponse(t, c)
	if got := collapse(types(evs)); !slices.Equal(got, textSeq) {
		t.Fatalf("events = %v, want %v", got, textSeq)
	}
	if got, want := joined(evs, "response.output_text.delta"), "Tool result received: Chunk ID: 02e663\nWall time: 0.0960 seconds\nProcess exited wi"; got != want {
		t.Errorf("reply = %q, want %q", got, want)
	}
}
