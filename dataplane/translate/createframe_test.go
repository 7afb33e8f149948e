package translate

import (
	"encoding/json"
	"strings"
	"testing"
)

// CreateFrame skips re-validating only the items ToResponses built (the
// very same bytes); any other item is still checked.
func TestCreateFrameValidatesForeignItems(t *testing.T) {
	turn := translate(t, `{"model":"gpt-5-codex","max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`, Options{})
	if len(turn.Input) != 3 {
		t.Fatalf("%d items", len(turn.Input))
	}
	copied := make([]json.RawMessage, len(turn.Input))
	for i, it := range turn.Input {
		copied[i] = append(json.RawMessage(nil), it...)
	}
	tests := []struct {
		name    string
		input   []json.RawMessage
		wantErr string
	}{
		{"own items", turn.Input, ""},
		{"own tail", turn.Input[1:], ""},
		{"copies", copied, ""},
		{"foreign valid item", []json.RawMessage{json.RawMessage(`{"type":"message"}`)}, ""},
		{"foreign invalid item", []json.RawMessage{turn.Input[0], json.RawMessage(`{"type":`)}, "create frame: input item 1 is not valid JSON"},
		{"own item then trailing garbage", []json.RawMessage{append(turn.Input[0][:len(turn.Input[0]):len(turn.Input[0])], 'x')}, "create frame: input item 0 is not valid JSON"},
		{"empty item", []json.RawMessage{{}}, "create frame: input item 0 is not valid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := turn.CreateFrame("resp_1", tt.input)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid(f) || !strings.HasSuffix(string(f), `"previous_response_id":"resp_1"}`) {
				t.Errorf("frame %s", f)
			}
		})
	}

	// An item replaced in Input after ToResponses is not the built one.
	turn.Input[2] = json.RawMessage(`{"broken"`)
	if _, err := turn.CreateFrame("", nil); err == nil || err.Error() != "create frame: input item 2 is not valid JSON" {
		t.Errorf("replaced item: err = %v", err)
	}
}
