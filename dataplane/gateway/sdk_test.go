package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/internal/codexsim"
)

func sdkClient(e *env) anthropic.Client {
	return anthropic.NewClient(
		option.WithBaseURL(e.url),
		option.WithAPIKey("any-key-works-on-loopback"),
		option.WithHTTPClient(e.client),
		option.WithMaxRetries(0),
	)
}

func userParams(text string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(text))},
	}
}

func TestSDKStreamsText(t *testing.T) {
	e := newEnv(t, envOptions{})
	client := sdkClient(e)
	stream := client.Messages.NewStreaming(t.Context(), userParams("#sim reply Hello there, this is a streamed reply with ünïcödé ✓."))
	var msg anthropic.Message
	events := 0
	for stream.Next() {
		if err := msg.Accumulate(stream.Current()); err != nil {
			t.Fatalf("Accumulate: %v", err)
		}
		events++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Type != "text" {
		t.Fatalf("content = %+v, want one text block", msg.Content)
	}
	if got, want := msg.Content[0].Text, "Hello there, this is a streamed reply with ünïcödé ✓."; got != want {
		t.Errorf("text = %q, want %q", got, want)
	}
	if msg.StopReason != "end_turn" {
		t.Errorf("stop_reason = %q, want end_turn", msg.StopReason)
	}
	if string(msg.Model) != "claude-sonnet-4-5" {
		t.Errorf("model = %q, want the requested claude-sonnet-4-5 echoed", msg.Model)
	}
	// The usage is the one response's usage the sim reported.
	st := e.sim.Stats()
	in, cached, out := st.InputTokens, st.CachedTokens, st.OutputTokens
	if msg.Usage.InputTokens != in-cached || msg.Usage.CacheReadInputTokens != cached || msg.Usage.OutputTokens != out {
		t.Errorf("usage = input %d, cache_read %d, output %d; sim reported input %d cached %d output %d (want input-cached, cached, output)",
			msg.Usage.InputTokens, msg.Usage.CacheReadInputTokens, msg.Usage.OutputTokens, in, cached, out)
	}
	if in == 0 || out == 0 {
		t.Errorf("sim reported input %d output %d; want non-zero usage to compare", in, out)
	}
	if st.Upgrades != 1 || st.CompletedResponses != 1 {
		t.Errorf("sim stats upgrades=%d completed=%d, want 1 and 1", st.Upgrades, st.CompletedResponses)
	}
}

func TestSDKStreamsToolCall(t *testing.T) {
	e := newEnv(t, envOptions{})
	client := sdkClient(e)
	params := userParams(`#sim call Bash {"command":"ls -la","description":"List files"}`)
	params.Tools = []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{
		Name: "Bash",
		InputSchema: anthropic.ToolInputSchemaParam{
			Properties: map[string]any{"command": map[string]any{"type": "string"}, "description": map[string]any{"type": "string"}},
			Required:   []string{"command"},
		},
	}}}
	stream := client.Messages.NewStreaming(t.Context(), params)
	var msg anthropic.Message
	for stream.Next() {
		if err := msg.Accumulate(stream.Current()); err != nil {
			t.Fatalf("Accumulate: %v", err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	var tools []anthropic.ContentBlockUnion
	for _, b := range msg.Content {
		if b.Type == "tool_use" {
			tools = append(tools, b)
		}
	}
	if len(tools) != 1 {
		t.Fatalf("content = %+v, want exactly one tool_use block", msg.Content)
	}
	if tools[0].Name != "Bash" {
		t.Errorf("tool name = %q, want Bash", tools[0].Name)
	}
	var input map[string]any
	if err := json.Unmarshal(tools[0].Input, &input); err != nil {
		t.Fatalf("tool input %s: %v", tools[0].Input, err)
	}
	if len(input) != 2 || input["command"] != "ls -la" || input["description"] != "List files" {
		t.Errorf("tool input = %s, want {\"command\":\"ls -la\",\"description\":\"List files\"}", tools[0].Input)
	}
	if tools[0].ID == "" {
		t.Error("tool_use id is empty")
	}
	if msg.StopReason != "tool_use" {
		t.Errorf("stop_reason = %q, want tool_use", msg.StopReason)
	}
}

func TestSDKNonStreaming(t *testing.T) {
	e := newEnv(t, envOptions{})
	client := sdkClient(e)
	msg, err := client.Messages.New(t.Context(), userParams("#sim reply A complete non-streaming answer."))
	if err != nil {
		t.Fatalf("Messages.New: %v", err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Text != "A complete non-streaming answer." {
		t.Errorf("content = %+v, want one text block \"A complete non-streaming answer.\"", msg.Content)
	}
	st := e.sim.Stats()
	in, cached, out := st.InputTokens, st.CachedTokens, st.OutputTokens
	if st.CompletedResponses != 1 || msg.Usage.InputTokens != in-cached || msg.Usage.OutputTokens != out {
		t.Errorf("usage = %+v; sim reported input %d cached %d output %d", msg.Usage, in, cached, out)
	}
	if msg.StopReason != "end_turn" {
		t.Errorf("stop_reason = %q, want end_turn", msg.StopReason)
	}
}

func TestSDKDefaultReply(t *testing.T) {
	e := newEnv(t, envOptions{})
	client := sdkClient(e)
	msg, err := client.Messages.New(t.Context(), userParams("what is in this directory?"))
	if err != nil {
		t.Fatalf("Messages.New: %v", err)
	}
	want := "Hello from clodex-sim. You said: what is in this directory?"
	if len(msg.Content) != 1 || msg.Content[0].Text != want {
		t.Errorf("content = %+v, want %q", msg.Content, want)
	}
}

// A client that disconnects mid-stream cancels the upstream turn: the
// socket is closed at once and the sim sees it go before the response
// completes.
func TestClientDisconnectMidStreamClosesUpstream(t *testing.T) {
	e := newEnv(t, envOptions{sim: codexsim.Config{Faults: codexsim.Faults{InterEventDelay: 50 * time.Millisecond}}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/messages?beta=true",
		strings.NewReader(gateway.MessagesBody(true, "#sim reply "+strings.Repeat("many words ", 200))))
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "event: content_block_delta") {
			break // output is flowing
		}
	}
	cancel()
	gateway.WaitFor(t, "the sim to see the socket closed", func() bool { return e.sim.Stats().OpenSockets == 0 })
	if st := e.sim.Stats(); st.CompletedResponses != 0 || st.Upgrades != 1 {
		t.Errorf("sim completed %d responses on %d sockets, want 0 on 1 (the turn was cancelled, not retried)", st.CompletedResponses, st.Upgrades)
	}
}

// A client that disconnects before any output (the backend is stalled)
// also cancels the upstream turn.
func TestClientDisconnectBeforeOutputClosesUpstream(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/messages", strings.NewReader(gateway.MessagesBody(true, "#sim stall")))
	req.Header.Set("Content-Type", "application/json")
	done := make(chan error, 1)
	go func() {
		resp, err := e.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	gateway.WaitFor(t, "the turn to reach the sim", func() bool { return e.sim.Stats().Responses > 0 })
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled request ended with %v, want context.Canceled (or a response)", err)
	}
	gateway.WaitFor(t, "the sim to see the socket closed", func() bool { return e.sim.Stats().OpenSockets == 0 })
	if socks := e.sim.Sockets(); len(socks) != 1 || !socks[0].Closed || len(socks[0].Sent()) != 1 {
		t.Errorf("sim sockets %+v, want one, closed after its one response.create", socks)
	}
}
