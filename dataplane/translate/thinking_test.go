package translate

import (
	"strings"
	"testing"
)

// thinkingEvents runs frames, then a completed response, and returns the data of
// every event between message_start and message_delta.
func thinkingEvents(t *testing.T, frames ...string) []string {
	t.Helper()
	frames = append(frames, `{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":3,"output_tokens":2}}}`)
	s, rec, state := runFrames(t, &Turn{RequestedModel: "m"}, frames)
	if state != StateCompleted {
		t.Fatalf("state %v %v", state, s.Failure())
	}
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range rec.events {
		if n, d := splitEvent(e); n != "message_start" && n != "message_delta" && n != "message_stop" {
			got = append(got, d)
		}
	}
	return got
}

const (
	rsAdded   = `{"type":"response.output_item.added","output_index":0,"item":{"type":"reasoning","id":"rs","summary":[]}}`
	msgAdded  = `{"type":"response.output_item.added","output_index":1,"item":{"type":"message","id":"m","role":"assistant","content":[]}}`
	msgDelta  = `{"type":"response.output_text.delta","output_index":1,"content_index":0,"delta":"Hi"}`
	msgDone   = `{"type":"response.output_item.done","output_index":1,"item":{"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"Hi"}]}}`
	thinkOpen = `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`
	textOpen1 = `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`
	textHi1   = `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}`
	stop0     = `{"type":"content_block_stop","index":0}`
	stop1     = `{"type":"content_block_stop","index":1}`
)

func summaryDelta(part int, d string) string {
	return `{"type":"response.reasoning_summary_text.delta","output_index":0,"summary_index":` + string(rune('0'+part)) + `,"delta":"` + d + `"}`
}

func partAdded(part int) string {
	return `{"type":"response.reasoning_summary_part.added","output_index":0,"summary_index":` + string(rune('0'+part)) + `}`
}

// TestThinkingBlocks: one thinking block per reasoning item, whatever its summary parts,
// the parts joined by a blank line, and every block signed: with the item's
// encrypted_content, or UnsignedThinking when the backend sent none; an item with neither
// text nor signature has no block (docs/translation.md §9.2).
func TestThinkingBlocks(t *testing.T) {
	tests := []struct {
		name   string
		frames []string
		want   []string
	}{
		{"three parts streamed, the first empty",
			[]string{rsAdded, partAdded(0), partAdded(1), summaryDelta(1, "Plan"), summaryDelta(1, " it."), partAdded(2), summaryDelta(2, "Do it."),
				`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs","encrypted_content":"SIG","summary":[{"type":"summary_text","text":""},{"type":"summary_text","text":"Plan it."},{"type":"summary_text","text":"Do it."}]}}`,
				msgAdded, msgDelta, msgDone},
			[]string{thinkOpen,
				`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Plan"}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":" it."}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"\n\nDo it."}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}}`,
				stop0, textOpen1, textHi1, stop1}},
		{"parts only in the done item",
			[]string{rsAdded,
				`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs","encrypted_content":"SIG","summary":[{"type":"summary_text","text":"One."},{"type":"summary_text","text":"Two."}]}}`},
			[]string{thinkOpen,
				`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"One."}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"\n\nTwo."}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}}`,
				stop0}},
		{"a signature and no text: the block comes before the next one",
			[]string{rsAdded,
				`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs","encrypted_content":"SIG","summary":[]}}`,
				msgAdded, msgDelta, msgDone},
			[]string{thinkOpen,
				`{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}}`,
				stop0, textOpen1, textHi1, stop1}},
		{"a signature and no text, last: the block comes at the end",
			[]string{rsAdded,
				`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs","encrypted_content":"SIG","summary":[]}}`},
			[]string{thinkOpen,
				`{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}}`,
				stop0}},
		{"text without encrypted_content",
			[]string{rsAdded, summaryDelta(0, "Hmm."),
				`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs","summary":[{"type":"summary_text","text":"Hmm."}]}}`,
				msgAdded, msgDelta, msgDone},
			[]string{thinkOpen,
				`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Hmm."}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"clodex:unsigned"}}`,
				stop0, textOpen1, textHi1, stop1}},
		{"neither text nor signature: no block",
			[]string{rsAdded,
				`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs","summary":[]}}`,
				msgAdded, msgDelta, msgDone},
			[]string{`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
				stop0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := thinkingEvents(t, tt.frames...)
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("events\n got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// TestThinkingBlocksCollected: the non-streaming answer has the same single, signed block.
func TestThinkingBlocksCollected(t *testing.T) {
	c := NewCollector()
	s := NewStream(&Turn{RequestedModel: "m"}, c, "msg_1")
	for _, f := range []string{rsAdded, partAdded(0), summaryDelta(0, "A."), partAdded(1), summaryDelta(1, "B."),
		`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs","encrypted_content":"SIG","summary":[{"type":"summary_text","text":"A."},{"type":"summary_text","text":"B."}]}}`,
		msgAdded, msgDelta, msgDone,
		`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":3,"output_tokens":2}}}`} {
		if _, err := s.Handle([]byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	msg, err := c.Message()
	if err != nil {
		t.Fatal(err)
	}
	want := `"content":[{"type":"thinking","thinking":"A.\n\nB.","signature":"SIG"},{"type":"text","text":"Hi"}]`
	if !strings.Contains(string(msg), want) {
		t.Errorf("message %s\nwant content %s", msg, want)
	}
}

// TestResumeClosesAnEmptyTextBlock: a failure after an empty text block was opened is
// resumed; the next attempt closes that block and goes on at the next index.
func TestResumeClosesAnEmptyTextBlock(t *testing.T) {
	rec := &recorder{}
	s := NewStream(&Turn{RequestedModel: "m"}, rec, "msg_1")
	for _, f := range []string{
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"m","role":"assistant","content":[]}}`,
		`{"type":"response.failed","response":{"error":{"code":"server_error"}}}`,
	} {
		if _, err := s.Handle([]byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	if !s.Resumable() {
		t.Fatal("Resumable() = false after an empty text block")
	}
	n, err := s.Resume()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{msgAdded, msgDelta, msgDone, `{"type":"response.completed","response":{"id":"r2"}}`} {
		if _, err := n.Handle([]byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Finish(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range rec.events {
		name, d := splitEvent(e)
		if strings.HasPrefix(name, "content_block") {
			got = append(got, d)
		}
	}
	want := []string{`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`, stop0, textOpen1, textHi1, stop1}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events\n got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestMessageStartUsage: message_start carries the request's count_tokens estimate, the
// part of it the socket already holds (a continuation) as cache_read_input_tokens, never
// more than the whole; message_delta the backend's exact figures (docs/translation.md §9.3).
func TestMessageStartUsage(t *testing.T) {
	tests := []struct {
		name   string
		cached int
		start  string
	}{
		{"new socket", 0, `"usage":{"input_tokens":1200,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}`},
		{"continuation", 1000, `"usage":{"input_tokens":200,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":1000}`},
		{"cached beyond the estimate", 5000, `"usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":1200}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			s := NewStream(&Turn{RequestedModel: "m", EstimatedInputTokens: 1200}, rec, "msg_1")
			s.SetCachedPrefix(tt.cached)
			for _, f := range []string{msgAdded, msgDelta, msgDone,
				`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":1500,"input_tokens_details":{"cached_tokens":1100},"output_tokens":7}}}`} {
				if _, err := s.Handle([]byte(f)); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Finish(); err != nil {
				t.Fatal(err)
			}
			var start, delta string
			for _, e := range rec.events {
				switch n, d := splitEvent(e); n {
				case "message_start":
					start = d
				case "message_delta":
					delta = d
				}
			}
			if !strings.Contains(start, tt.start) {
				t.Errorf("message_start %s\nwant usage %s", start, tt.start)
			}
			if want := `"usage":{"input_tokens":400,"output_tokens":7,"cache_creation_input_tokens":0,"cache_read_input_tokens":1100}`; !strings.Contains(delta, want) {
				t.Errorf("message_delta %s\nwant usage %s (the backend's figures)", delta, want)
			}
		})
	}
}
