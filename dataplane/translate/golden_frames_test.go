package translate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/clodex/clodex/internal/captures"
)

// paddedFirstTurn returns the captured Claude Code 2.1.332 first turn (12
// tools) rebuilt to full size, as the gateway's BenchmarkOverhead does: the
// capture shortened long strings (marked "…[truncated; N chars total]") and
// summarised tool schemas; strings get their length back with filler,
// schemas become objects of string properties, and the main system prompt
// is padded so the body reaches padTo bytes (the real request is about
// 88 KB). The result is deterministic (json.Marshal sorts map keys).
func paddedFirstTurn(tb testing.TB, padTo int) []byte {
	tb.Helper()
	raw, err := captures.ReadFile(path.Join(fixtureDir, "cc-2.1.332-messages-request-custom-model.json"))
	if err != nil {
		tb.Fatalf("read fixture: %v", err)
	}
	var capture struct {
		Body map[string]any `json:"body"`
	}
	if err := json.Unmarshal(raw, &capture); err != nil {
		tb.Fatal(err)
	}
	body := restoreTruncated(capture.Body).(map[string]any)
	for _, tl := range body["tools"].([]any) {
		tool := tl.(map[string]any)
		if props, ok := tool["input_schema.properties"].([]any); ok {
			p := map[string]any{}
			for _, name := range props {
				p[name.(string)] = map[string]any{"type": "string", "description": "The " + name.(string) + " argument."}
			}
			schema := map[string]any{"type": "object", "properties": p, "additionalProperties": false,
				"$schema": "https://json-schema.org/draft/2020-12/schema"}
			if req, ok := tool["input_schema.required"]; ok {
				schema["required"] = req
			}
			delete(tool, "input_schema.properties")
			delete(tool, "input_schema.required")
			tool["input_schema"] = schema
		}
	}
	out, err := json.Marshal(body)
	if err != nil {
		tb.Fatal(err)
	}
	if padTo > len(out) {
		sys := body["system"].([]any)
		last := sys[len(sys)-1].(map[string]any)
		filler := strings.Repeat("Use the dedicated tools for file operations and keep answers short. ", (padTo-len(out))/68+1)
		last["text"] = last["text"].(string) + "\n" + filler[:padTo-len(out)]
		if out, err = json.Marshal(body); err != nil {
			tb.Fatal(err)
		}
	}
	return out
}

var truncatedMark = regexp.MustCompile(`…\[truncated; (\d+) chars total\]$`)

// restoreTruncated gives every truncated string of a capture its original
// length.
func restoreTruncated(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = restoreTruncated(e)
		}
	case []any:
		for i, e := range x {
			x[i] = restoreTruncated(e)
		}
	case string:
		if m := truncatedMark.FindStringSubmatchIndex(x); m != nil {
			n, _ := strconv.Atoi(x[m[2]:m[3]])
			s := x[:m[0]] + strings.Repeat(" lorem ipsum dolor", n/18+1)
			if r := []rune(s); len(r) > n {
				s = string(r[:n])
			}
			return s
		}
	}
	return v
}

// goldenFixtures are request bodies whose response.create frame, token
// estimate and count_tokens answer are pinned in testdata/ (the goldens
// were produced by the translation before it was optimised and reviewed by
// hand; the optimised code must reproduce them byte for byte).
var goldenFixtures = []struct {
	golden string
	body   func(testing.TB) []byte
	opts   Options
}{
	{"cc-first-turn-88k.frame.json", func(tb testing.TB) []byte { return paddedFirstTurn(tb, 88<<10) }, Options{}},
	{"default-model.frame.json", func(tb testing.TB) []byte {
		return fixtureBody(tb, "cc-2.1.332-messages-request-default-model.json")
	}, Options{SessionHeader: "not-a-uuid"}},
	{"tool-bash-turn2.frame.json", func(tb testing.TB) []byte {
		return fixtureBody(tb, "cc-2.1.332-tool-bash-turn2-request.json")
	}, Options{ServiceTier: "fast"}},
	{"cc-2.1.197-interactive.frame.json", func(tb testing.TB) []byte {
		return fixtureBody(tb, "cc-2.1.197-interactive-request.json")
	}, Options{}},
	{"thinking-images-tools.frame.json", func(testing.TB) []byte { return []byte(mixedBody) }, Options{}},
}

// mixedBody exercises what the captures lack: images (inline, by URL,
// inside a tool result), thinking with a signature, tool inputs with
// unsorted keys, escapes, numbers kept exact, a tool_choice, a deferred
// tool, and an in-conversation system message.
const mixedBody = `{
  "model": "claude-sonnet-4-5", "max_tokens": 64000, "stream": false, "temperature": 1,
  "thinking": {"type": "enabled", "budget_tokens": 8000},
  "system": [{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.332\nYou are <Claude> & \"friends\"\u2028."}],
  "tool_choice": {"type": "tool", "name": "Read", "disable_parallel_tool_use": true},
  "tools": [
    {"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["file_path"]}},
    {"name": "Hidden", "description": "deferred", "defer_loading": true, "input_schema": {"type": "object"}},
    {"type": "web_search_20250305", "name": "web_search"}
  ],
  "messages": [
    {"role": "user", "content": [
      {"type": "text", "text": "look at these <b>images</b> \u00e9 \ud83d\ude00"},
      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
      {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png?x=1&y=2"}}
    ]},
    {"role": "assistant", "content": [
      {"type": "thinking", "thinking": "Let me read it.", "signature": "c2lnbmF0dXJl"},
      {"type": "thinking", "thinking": "unsigned, dropped"},
      {"type": "text", "text": "Reading."},
      {"type": "tool_use", "id": "toolu_01__ts__abc", "name": "Read", "input": {"z": 1.50, "file_path": "a.png", "n": 12345678901234567890, "o": {"b": null, "a": []}}}
    ]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_01__ts__abc", "content": [
        {"type": "text", "text": "here it is", "cache_control": {"type": "ephemeral"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}}
      ]},
      {"type": "text", "text": "thanks"}
    ]},
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "go on"}
  ]
}`

// The response.create frame of every golden fixture is byte-identical to
// the reviewed golden (indented there for review; the frame itself must be
// compact), and the token estimate and count_tokens answer match the
// pinned values.
func TestGoldenFrames(t *testing.T) {
	var estimates strings.Builder
	for _, g := range goldenFixtures {
		t.Run(g.golden, func(t *testing.T) {
			body := g.body(t)
			req, err := DecodeRequest(body)
			if err != nil {
				t.Fatalf("DecodeRequest: %v", err)
			}
			turn, err := ToResponses(req, g.opts)
			if err != nil {
				t.Fatal(err)
			}
			f, err := turn.CreateFrame("", nil)
			if err != nil {
				t.Fatal(err)
			}
			var compact bytes.Buffer
			if err := json.Compact(&compact, f); err != nil || !bytes.Equal(compact.Bytes(), f) {
				t.Errorf("frame is not compact JSON (%v)", err)
			}
			golden(t, g.golden, turn)
			n, err := CountTokens(body)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&estimates, "%s bytes=%d estimate=%d count_tokens=%d\n", g.golden, len(body), turn.EstimatedInputTokens, n)
		})
	}
	goldenPath := filepath.Join("testdata", "estimates.golden")
	if *update {
		if err := os.WriteFile(goldenPath, []byte(estimates.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatalf("read golden (run with -update to create): %v", err)
	}
	if estimates.String() != string(want) {
		t.Errorf("estimates differ from %s:\n got %s\nwant %s", goldenPath, estimates.String(), want)
	}
}
