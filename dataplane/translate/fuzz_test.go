package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"claude-sonnet-4-5","max_tokens":1,"thinking":{"type":"enabled","budget_tokens":31999},"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"tool_use","id":"i","name":"n","input":{"a":null}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"i","content":[{"type":"image","source":{"type":"url","url":"u"}},{"type":"tool_reference","tool_name":"X"}]}]}],"tools":[{"name":"X","input_schema":{},"defer_loading":true}],"tool_choice":{"type":"any","disable_parallel_tool_use":true}}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"model":1e999}`))
	f.Add([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"output_config":{"format":{"type":"json_schema","schema":{"type":"object","properties":{"a":{"anyOf":[{"$ref":"#/$defs/x"},{"type":"null"}]},"b":{"type":"array","items":{"type":"object"}}},"required":["a"],"$defs":{"x":{"type":"object","properties":{}}}}}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeRequest(body)
		if _, cerr := CountTokens(body); cerr != nil {
			var re *RequestError
			if !errors.As(cerr, &re) {
				t.Fatalf("CountTokens error %T %v", cerr, cerr)
			}
		}
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("error %T %v is not a *RequestError", err, err)
			}
			return
		}
		if !utf8.Valid(body) {
			t.Fatalf("accepted a body that is not UTF-8: %q", body)
		}
		turn, err := ToResponses(req, Options{SessionHeader: "x"})
		if err != nil {
			// A request of which nothing would reach the model is refused
			// here (the gateway answers 400), nothing else.
			var re *RequestError
			if !errors.As(err, &re) || re.Field != "messages" {
				t.Fatalf("ToResponses: %T %v, want nil or the messages *RequestError", err, err)
			}
			return
		}
		frame, err := turn.CreateFrame("resp_1", nil)
		if err != nil {
			t.Fatalf("CreateFrame: %v", err)
		}
		if !json.Valid(frame) {
			t.Fatalf("frame is not JSON: %s", frame)
		}
		for _, it := range turn.Input {
			c, err := CanonicalItem(it)
			if err != nil {
				t.Fatalf("input item %s: %v", it, err)
			}
			// Items are sent in canonical form, except reasoning items,
			// which keep the summary the backend requires.
			if !bytes.HasPrefix(it, []byte(`{"encrypted_content"`)) && !bytes.Equal(c, it) {
				t.Fatalf("input item not canonical:\n%s\n%s", it, c)
			}
		}
	})
}

func FuzzStreamHandle(f *testing.F) {
	f.Add([]byte(strings.Join(spec16Frames, "\n")))
	f.Add([]byte(`{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","call_id":"c","name":"n"}}
{"type":"response.function_call_arguments.delta","output_index":0,"delta":"{\"a\":"}
{"type":"response.completed","response":{"id":"r"}}`))
	f.Add([]byte(`{"type":"response.reasoning_summary_text.delta","summary_index":3,"delta":"x"}
{"type":"error","status":429,"error":{"retry_after_seconds":"7"}}`))
	f.Add([]byte(`{"type":"response.output_text.delta","delta":"\ud800"}` + "\n" + `{"type":"response.incomplete","response":{"incomplete_details":{"reason":"max_output_tokens"}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec := &recorder{}
		col := NewCollector()
		w := multiWriter{rec, col}
		turn := &Turn{RequestedModel: "m", ContextWindow: 100, EstimatedInputTokens: 3, required: map[string][]string{"n": {"a"}}}
		s := NewStream(turn, w, "msg")
		state := StateRunning
		for _, frame := range bytes.Split(data, []byte("\n")) {
			var err error
			state, err = s.Handle(frame)
			if err != nil {
				t.Fatalf("Handle: %v", err)
			}
		}
		switch state {
		case StateCompleted:
			if err := s.Finish(); err != nil {
				t.Fatalf("Finish: %v", err)
			}
			if _, err := col.Message(); err != nil {
				t.Fatalf("Message: %v", err)
			}
			for _, it := range s.OutputItems() {
				if !json.Valid(it) {
					t.Fatalf("output item %s", it)
				}
			}
		case StateFailed:
			e := s.Failure()
			if e == nil || e.Status < 400 || e.Status > 599 || e.Type == "" || e.Message == "" {
				t.Fatalf("failure %+v", e)
			}
			if s.Committed() {
				if err := s.Abort(nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := s.Ping(); err != nil {
			t.Fatal(err)
		}
	})
}

// multiWriter feeds both the validating recorder and a Collector.
type multiWriter []EventWriter

func (m multiWriter) WriteEvent(name string, data []byte) error {
	for _, w := range m {
		if err := w.WriteEvent(name, data); err != nil {
			return err
		}
	}
	return nil
}

// The seed corpora in testdata/fuzz include every captured request body.
func TestFuzzCorpusHasFixtures(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join("testdata", "fuzz", "FuzzDecodeRequest"))
	if err != nil || len(entries) < 6 {
		t.Fatalf("FuzzDecodeRequest corpus: %d entries, %v", len(entries), err)
	}
	entries, err = os.ReadDir(filepath.Join("testdata", "fuzz", "FuzzStreamHandle"))
	if err != nil || len(entries) < 3 {
		t.Fatalf("FuzzStreamHandle corpus: %d entries, %v", len(entries), err)
	}
}
