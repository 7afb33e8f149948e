package translate

import (
	"strings"
	"testing"
)

type discard struct{}

func (discard) WriteEvent(string, []byte) error { return nil }

// BenchmarkStreamHandleTextDelta measures one output_text.delta frame
// translated into one content_block_delta event.
func BenchmarkStreamHandleTextDelta(b *testing.B) {
	s := NewStream(&Turn{RequestedModel: "claude-opus-5-5"}, discard{}, "msg_1")
	if _, err := s.Handle([]byte(`{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"msg_1","role":"assistant","content":[]}}`)); err != nil {
		b.Fatal(err)
	}
	frame := []byte(`{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello, wörld! Here is some text.","sequence_number":42}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, err := s.Handle(frame); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStreamHandleThinkingDelta measures one reasoning summary delta.
func BenchmarkStreamHandleThinkingDelta(b *testing.B) {
	s := NewStream(&Turn{RequestedModel: "m"}, discard{}, "msg_1")
	if _, err := s.Handle([]byte(`{"type":"response.output_item.added","output_index":0,"item":{"type":"reasoning","id":"rs_1","summary":[]}}`)); err != nil {
		b.Fatal(err)
	}
	frame := []byte(`{"type":"response.reasoning_summary_text.delta","item_id":"rs_1","output_index":0,"summary_index":0,"delta":"Thinking about the user's request."}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Handle(frame); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStreamHandleArgumentsDelta measures a buffered (not forwarded)
// function_call_arguments.delta.
func BenchmarkStreamHandleArgumentsDelta(b *testing.B) {
	s := NewStream(&Turn{RequestedModel: "m"}, discard{}, "msg_1")
	if _, err := s.Handle([]byte(`{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc","call_id":"c","name":"Bash"}}`)); err != nil {
		b.Fatal(err)
	}
	frame := []byte(`{"type":"response.function_call_arguments.delta","item_id":"fc","output_index":0,"delta":"\"ls -la\","}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Handle(frame); err != nil {
			b.Fatal(err)
		}
		if len(s.items[0].args) > 1<<20 {
			s.items[0].args = s.items[0].args[:0]
		}
	}
}

// BenchmarkStreamSpec16Turn runs a whole text turn with a reasoning summary
// (spec16Frames, 12 upstream frames) and reports the cost per upstream event.
func BenchmarkStreamSpec16Turn(b *testing.B) {
	frames := make([][]byte, len(spec16Frames))
	for i, f := range spec16Frames {
		frames[i] = []byte(f)
	}
	turn := &Turn{RequestedModel: "clodex:openai-oauth:gpt-5.6-sol"}
	b.ReportAllocs()
	for b.Loop() {
		s := NewStream(turn, discard{}, "msg_1")
		for _, f := range frames {
			if _, err := s.Handle(f); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Finish(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(frames)), "ns/event")
}

// BenchmarkToResponsesClaudeCodeFirstTurn decodes and translates Claude
// Code 2.1.332's first request and renders its frame.
func BenchmarkToResponsesClaudeCodeFirstTurn(b *testing.B) {
	body := fixtureBody(b, "cc-2.1.332-messages-request-custom-model.json")
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		req, err := DecodeRequest(body)
		if err != nil {
			b.Fatal(err)
		}
		turn, err := ToResponses(req, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := turn.CreateFrame("", nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCanonicalItem(b *testing.B) {
	item := []byte(`{"type":"function_call","call_id":"call_9xQ","name":"Read","arguments":"{\"file_path\":\"README.md\",\"limit\":10}"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := CanonicalItem(item); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCountTokens(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", 2000) + `"}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := CountTokens(body); err != nil {
			b.Fatal(err)
		}
	}
}

// translateOnce is what the gateway does per request before it writes the
// frame: decode, translate, render.
func translateOnce(b *testing.B, body []byte) {
	req, err := DecodeRequest(body)
	if err != nil {
		b.Fatal(err)
	}
	turn, err := ToResponses(req, Options{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := turn.CreateFrame("", turn.Input); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkTranslateClaudeCodeFirstTurn88KB decodes, translates and renders
// the Claude Code 2.1.332 first turn (12 tools) rebuilt to its real size of
// about 88 KB, as the gateway's BenchmarkOverhead sends it. The data
// plane's whole overhead on this turn should stay within 2 ms at p50.
//
//	go test -run '^$' -bench 'BenchmarkTranslate' -count 5 ./dataplane/translate
func BenchmarkTranslateClaudeCodeFirstTurn88KB(b *testing.B) {
	body := paddedFirstTurn(b, 88<<10)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		translateOnce(b, body)
	}
}

// BenchmarkTranslateShortMessage is the same path for one short user
// message (budget: 0.3 ms p50 for the whole overhead).
func BenchmarkTranslateShortMessage(b *testing.B) {
	body := []byte(`{"model":"claude-sonnet-4-5","max_tokens":32000,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"#sim reply Hello there"}]}]}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		translateOnce(b, body)
	}
}

// BenchmarkCountTokensClaudeCodeFirstTurn88KB is the count_tokens estimate
// of the 88 KB first turn.
func BenchmarkCountTokensClaudeCodeFirstTurn88KB(b *testing.B) {
	body := paddedFirstTurn(b, 88<<10)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := CountTokens(body); err != nil {
			b.Fatal(err)
		}
	}
}
