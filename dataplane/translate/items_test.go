package translate

import (
	"testing"
)

func TestCanonicalItem(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"keys sorted, nulls kept, whitespace gone", `{ "role":"user", "content":[{"type":"input_text","text":"a  b","x":null}] }`,
			`{"content":[{"text":"a  b","type":"input_text","x":null}],"role":"user"}`},
		{"function_call arguments canonical", `{"type":"function_call","call_id":"c","name":"n","arguments":"{ \"b\": 1, \"a\": {\"d\":2,\"c\":3} }"}`,
			`{"arguments":"{\"a\":{\"c\":3,\"d\":2},\"b\":1}","call_id":"c","name":"n","type":"function_call"}`},
		{"unparseable arguments kept", `{"type":"function_call","arguments":"{oops"}`,
			`{"arguments":"{oops","type":"function_call"}`},
		{"custom_tool_call input", `{"type":"custom_tool_call","input":"[1, 2]"}`,
			`{"input":"[1,2]","type":"custom_tool_call"}`},
		{"output stays byte-exact", `{"type":"function_call_output","call_id":"c","output":"{ \"b\": 1 }"}`,
			`{"call_id":"c","output":"{ \"b\": 1 }","type":"function_call_output"}`},
		{"reasoning with blob drops summary and empty content", `{"type":"reasoning","encrypted_content":"E","summary":[{"type":"summary_text","text":"s"}],"content":[]}`,
			`{"encrypted_content":"E","type":"reasoning"}`},
		{"reasoning without blob keeps summary", `{"type":"reasoning","encrypted_content":"","summary":[],"content":[{"type":"reasoning_text"}]}`,
			`{"content":[{"type":"reasoning_text"}],"encrypted_content":"","summary":[],"type":"reasoning"}`},
		{"numbers exact, html not escaped", `{"n":12345678901234567890,"f":1.50,"s":"<&>"}`,
			`{"f":1.50,"n":12345678901234567890,"s":"<&>"}`},
		{"unicode", `{"s":"\u00e9\ud83d\ude00"}`, `{"s":"é😀"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CanonicalItem([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("\n got %s\nwant %s", got, tt.want)
			}
		})
	}
	for _, bad := range []string{``, `{`, `{"a":1} {"b":2}`, `nul`} {
		if _, err := CanonicalItem([]byte(bad)); err == nil {
			t.Errorf("CanonicalItem(%q): want error", bad)
		}
	}
}

func TestSanitizeArguments(t *testing.T) {
	tests := []struct {
		args     string
		required []string
		want     string
	}{
		{`{"file_path":"README.md","limit":null}`, nil, `{"file_path":"README.md"}`},
		{`{"b":[],"a":[ ],"c":[1],"d":{}}`, []string{"a"}, `{"a":[],"c":[1],"d":{}}`},
		{`{"z":1,"y":{"n":null}}`, nil, `{"z":1,"y":{"n":null}}`},
		{`  `, nil, `{}`},
		{``, nil, `{}`},
		{`[1, null]`, nil, `[1,null]`},
		{`{broken`, nil, `{broken`},
		{`{"s":"\u00e9 <x>"}`, nil, `{"s":"\u00e9 <x>"}`}, // values are kept as sent, only compacted
	}
	for _, tt := range tests {
		if got := sanitizeArguments(tt.args, tt.required); got != tt.want {
			t.Errorf("sanitizeArguments(%q, %v) = %s, want %s", tt.args, tt.required, got, tt.want)
		}
	}
}
