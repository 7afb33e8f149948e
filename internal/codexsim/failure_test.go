package codexsim

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/coder/websocket"
)

func TestUsageLimitDirective(t *testing.T) {
	clock := newFakeClock()
	srv, ts := testServer(t, Config{Clock: clock.Now})
	c := mustDial(t, ts)
	send(t, c, create("#sim usage-limit 8123 pro", nil))
	e := readEvent(t, c)
	if e["status"] != float64(429) {
		t.Errorf("status = %v, want 429", e["status"])
	}
	eo := errorOf(t, e)
	if eo["code"] != "usage_limit_reached" || eo["type"] != "usage_limit_reached" || eo["plan_type"] != "pro" {
		t.Errorf("error = %v, want code and type usage_limit_reached, plan_type pro", eo)
	}
	if got, want := num(eo["resets_in_seconds"]), int64(8123); got != want {
		t.Errorf("resets_in_seconds = %d, want %d", got, want)
	}
	if got, want := num(eo["resets_at"]), clock.Now().Unix()+8123; got != want {
		t.Errorf("resets_at = %d, want %d", got, want)
	}
	// The socket stays usable and the next response runs normally.
	send(t, c, create("#sim reply fine", nil))
	if typ := last(readResponse(t, c))["type"]; typ != "response.completed" {
		t.Errorf("after a usage-limit answer: %v, want response.completed", typ)
	}
	if n := srv.Stats().Errors["usage_limit_reached"]; n != 1 {
		t.Errorf("errors[usage_limit_reached] = %d, want 1", n)
	}
	for _, bad := range []string{"#sim usage-limit", "#sim usage-limit soon", "#sim usage-limit -1", "#sim usage-limit 5 a b", "#sim usage-limit 5 pl@n"} {
		send(t, c, create(bad, nil))
		if code := errorOf(t, readEvent(t, c))["code"]; code != "invalid_sim_directive" {
			t.Errorf("%q: code %v, want invalid_sim_directive", bad, code)
		}
	}
}

func TestUsageLimitKnob(t *testing.T) {
	clock := newFakeClock()
	srv, ts := testServer(t, Config{Clock: clock.Now})
	if err := srv.SetConfig(ConfigPatch{UsageLimitResetsIn: ptr(Duration(90 * time.Second))}); err != nil {
		t.Fatal(err)
	}
	c := mustDial(t, ts)
	clock.Advance(30 * time.Second)
	resp, err := ts.Client().Get(ts.URL + ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	var view configView
	err = json.NewDecoder(resp.Body).Decode(&view)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if view.UsageLimitResetsIn != Duration(60*time.Second) || view.UsageLimitResetsAt != clock.Now().Unix()+60 {
		t.Errorf("GET /sim/config usage limit = %v at %d, want 1m0s at %d", time.Duration(view.UsageLimitResetsIn), view.UsageLimitResetsAt, clock.Now().Unix()+60)
	}
	send(t, c, create("#sim reply blocked", nil))
	eo := errorOf(t, readEvent(t, c))
	if eo["code"] != "usage_limit_reached" || eo["plan_type"] != DefaultUsageLimitPlan {
		t.Errorf("error = %v, want usage_limit_reached for plan %s", eo, DefaultUsageLimitPlan)
	}
	if got := num(eo["resets_in_seconds"]); got != 60 {
		t.Errorf("resets_in_seconds 30 s after a 90 s limit = %d, want 60", got)
	}
	// The directive-free prewarm is refused too: the whole account is limited.
	send(t, c, create("", map[string]any{"generate": false}))
	if code := errorOf(t, readEvent(t, c))["code"]; code != "usage_limit_reached" {
		t.Errorf("prewarm under a usage limit: code %v, want usage_limit_reached", code)
	}
	clock.Advance(60 * time.Second) // the reset
	send(t, c, create("#sim reply free again", nil))
	if typ := last(readResponse(t, c))["type"]; typ != "response.completed" {
		t.Errorf("after the reset: %v, want response.completed", typ)
	}
	// A new limit via the knob, then lifted with 0s.
	if err := srv.SetConfig(ConfigPatch{UsageLimitResetsIn: ptr(Duration(time.Hour)), UsageLimitPlan: ptr("team")}); err != nil {
		t.Fatal(err)
	}
	send(t, c, create("#sim reply x", nil))
	if eo := errorOf(t, readEvent(t, c)); eo["plan_type"] != "team" || num(eo["resets_in_seconds"]) != 3600 {
		t.Errorf("second limit: %v, want plan team, 3600 s", eo)
	}
	if err := srv.SetConfig(ConfigPatch{UsageLimitResetsIn: ptr(Duration(0))}); err != nil {
		t.Fatal(err)
	}
	send(t, c, create("#sim reply lifted", nil))
	if typ := last(readResponse(t, c))["type"]; typ != "response.completed" {
		t.Errorf("after lifting: %v, want response.completed", typ)
	}
	if err := srv.SetConfig(ConfigPatch{UsageLimitResetsIn: ptr(Duration(-time.Second))}); err == nil {
		t.Error("usage_limit_resets_in -1s accepted, want an error")
	}
	if err := srv.SetConfig(ConfigPatch{UsageLimitPlan: ptr("no spaces")}); err == nil {
		t.Error("usage_limit_plan with a space accepted, want an error")
	}
}

func TestFailResponsesKnob(t *testing.T) {
	srv, ts := testServer(t, Config{Faults: Faults{FailResponses: "server_is_overloaded"}})
	c := mustDial(t, ts)
	for range 2 {
		send(t, c, create("#sim reply never", nil))
		e := last(readResponse(t, c))
		if e["type"] != "response.failed" {
			t.Fatalf("terminal %v, want response.failed", e["type"])
		}
		eo := responseOf(t, e)["error"].(map[string]any)
		if eo["code"] != "server_is_overloaded" || eo["type"] != "service_unavailable_error" {
			t.Errorf("error = %v, want code server_is_overloaded, type service_unavailable_error", eo)
		}
	}
	// Prewarms still complete.
	send(t, c, create("", map[string]any{"generate": false}))
	if typ := last(readResponse(t, c))["type"]; typ != "response.completed" {
		t.Errorf("prewarm: %v, want response.completed", typ)
	}
	if err := srv.SetConfig(ConfigPatch{FailResponses: ptr("")}); err != nil {
		t.Fatal(err)
	}
	send(t, c, create("#sim reply ok", nil))
	if typ := last(readResponse(t, c))["type"]; typ != "response.completed" {
		t.Errorf("fault off: %v, want response.completed", typ)
	}
	if n := srv.Stats().Errors["server_is_overloaded"]; n != 2 {
		t.Errorf("errors[server_is_overloaded] = %d, want 2", n)
	}
	if _, err := New(Config{Faults: Faults{FailResponses: "bad code"}}); err == nil {
		t.Error("New with FailResponses \"bad code\" succeeded, want an error")
	}
}

func TestErrorTypes(t *testing.T) {
	tests := []struct{ code, want string }{
		{"server_error", "server_error"},
		{"server_is_overloaded", "service_unavailable_error"},
		{"slow_down", "service_unavailable_error"},
		{"rate_limit_exceeded", "rate_limit_error"},
		{"insufficient_quota", "insufficient_quota"},
		{"usage_not_included", "usage_not_included"},
		{"invalid_prompt", "invalid_request_error"},
	}
	for _, tt := range tests {
		if got := errorType(tt.code, 0); got != tt.want {
			t.Errorf("errorType(%q) = %q, want %q", tt.code, got, tt.want)
		}
	}
}

// pdfData is a tiny PDF, base64.
var pdfData = base64.StdEncoding.EncodeToString([]byte("%PDF-1.4\n1 0 obj << /Type /Page >> endobj\n%%EOF\n"))

func userParts(parts ...map[string]any) map[string]any {
	return map[string]any{"type": "message", "role": "user", "content": parts}
}

func TestContentParts(t *testing.T) {
	_, ts := testServer(t, Config{})
	c := mustDial(t, ts)
	text := map[string]any{"type": "input_text", "text": "#sim reply ok"}
	good := []map[string]any{
		{"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64," + pdfData},
		{"type": "input_file", "file_url": "https://example.com/a.pdf"},
		{"type": "input_file", "file_id": "file-1"},
		{"type": "input_image", "image_url": "data:image/webp;base64,AAAA"},
		{"type": "input_image", "image_url": "https://example.com/a.png"},
	}
	for _, p := range good {
		send(t, c, create("", map[string]any{"input": []any{userParts(text, p)}}))
		if typ := last(readResponse(t, c))["type"]; typ != "response.completed" {
			t.Errorf("part %v: %v, want response.completed", p, typ)
		}
	}
	bad := []struct {
		part        map[string]any
		code, param string
	}{
		{map[string]any{"type": "document", "text": "x"}, "invalid_value", "input[0].content[1].type"},
		{map[string]any{"type": "output_text", "text": "x"}, "invalid_value", "input[0].content[1].type"},
		{map[string]any{"type": "input_file", "file_data": "data:application/pdf;base64," + pdfData}, "invalid_value", "input[0].content[1].filename"},
		{map[string]any{"type": "input_file", "filename": "a.pdf", "file_data": "JVBERi0="}, "invalid_value", "input[0].content[1].file_data"},
		{map[string]any{"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,@@@"}, "invalid_value", "input[0].content[1].file_data"},
		{map[string]any{"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,"}, "invalid_value", "input[0].content[1].file_data"},
		{map[string]any{"type": "input_file", "file_url": "ftp://x/a.pdf"}, "invalid_value", "input[0].content[1].file_url"},
		{map[string]any{"type": "input_file"}, "invalid_value", "input[0].content[1]"},
		{map[string]any{"type": "input_file", "file_id": "f", "file_url": "https://x"}, "invalid_value", "input[0].content[1]"},
		{map[string]any{"type": "input_image", "image_url": "data:image/bmp;base64,Qk0="}, "unsupported_image_media_type", "input[0].content[1].image_url"},
		{map[string]any{"type": "input_image", "image_url": "data:image/png;base64,"}, "empty_image_file", "input[0].content[1].image_url"},
		{map[string]any{"type": "input_image", "image_url": "data:image/png;base64,!!"}, "invalid_base64_image", "input[0].content[1].image_url"},
		{map[string]any{"type": "input_image"}, "invalid_value", "input[0].content[1]"},
		{map[string]any{"type": "input_text", "text": 5}, "invalid_type", "input[0].content[1].text"},
	}
	for _, tt := range bad {
		send(t, c, create("", map[string]any{"input": []any{userParts(text, tt.part)}}))
		eo := errorOf(t, readEvent(t, c))
		if eo["code"] != tt.code || eo["param"] != tt.param {
			t.Errorf("part %v: code %v param %v, want %s at %s (%v)", tt.part, eo["code"], eo["param"], tt.code, tt.param, eo["message"])
		}
	}
	// An assistant message carries output_text, not input parts.
	asst := map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "input_text", "text": "x"}}}
	send(t, c, create("", map[string]any{"input": []any{asst, userParts(text)}}))
	if eo := errorOf(t, readEvent(t, c)); eo["param"] != "input[0].content[0].type" {
		t.Errorf("assistant input_text: param %v, want input[0].content[0].type", eo["param"])
	}
}

// TestInputFileTokens: an input_file counts like every item, by its
// canonical JSON, file data included.
func TestInputFileTokens(t *testing.T) {
	_, ts := testServer(t, Config{})
	c := mustDial(t, ts)
	item := fmt.Sprintf(`{"content":[{"text":"#sim reply ok","type":"input_text"},{"file_data":"data:application/pdf;base64,%s","filename":"a.pdf","type":"input_file"}],"role":"user","type":"message"}`, pdfData)
	send(t, c, `{"type":"response.create","model":"m","input":[`+item+`]}`)
	in, _, _, _, _ := usage(t, last(readResponse(t, c)))
	if want := ceil4(item); in != want {
		t.Errorf("input_tokens = %d, want %d (ceil(%d bytes / 4))", in, want, len(item))
	}
}

func TestDropSockets(t *testing.T) {
	srv, ts := testServer(t, Config{RecordFrames: true})
	c1, c2 := mustDial(t, ts), mustDial(t, ts)
	// The client's dial returns once the 101 is out; the server registers
	// the socket just after (with its record). Wait for both, or the drop
	// can miss the second.
	for deadline := time.Now().Add(10 * time.Second); len(srv.Sockets()) < 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if n := srv.DropSockets(); n != 2 {
		t.Errorf("DropSockets() = %d, want 2", n)
	}
	for _, c := range []*websocket.Conn{c1, c2} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // a socket left open fails, not hangs
		_, _, err := c.Read(ctx)
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil || closeStatus(err) != -1 || timedOut {
			t.Errorf("read after DropSockets: %v, want an abrupt end without a close frame", err)
		}
	}
	// The server still serves.
	c3 := mustDial(t, ts)
	send(t, c3, create("#sim reply still here", nil))
	if typ := last(readResponse(t, c3))["type"]; typ != "response.completed" {
		t.Errorf("after DropSockets: %v, want response.completed", typ)
	}
}
