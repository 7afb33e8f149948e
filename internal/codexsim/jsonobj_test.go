package codexsim

import (
	"encoding/json"
	"testing"
)

func TestAppendJSON(t *testing.T) {
	tests := []struct {
		in   any
		want string
	}{
		{obj{{"type", "x"}, {"n", 3}, {"ok", true}, {"none", nil}}, `{"type":"x","n":3,"ok":true,"none":null}`},
		{obj{{"s", "a\"b\\c\n\r\t\x01<>&é"}}, `{"s":"a\"b\\c\n\r\t\u0001<>&é"}`},
		{obj{{"bad", "x\xffy"}, {"ls", "\u2028"}}, `{"bad":"x\ufffdy","ls":"\u2028"}`},
		{obj{{"list", []any{1, "two", obj{}}}, {"objs", []obj{{{"a", int64(1)}}}}}, `{"list":[1,"two",{}],"objs":[{"a":1}]}`},
		{obj{{"f", 1.5}}, `{"f":1.5}`},
	}
	for _, tt := range tests {
		got := string(appendJSON(nil, tt.in))
		if got != tt.want {
			t.Errorf("appendJSON(%v) = %s, want %s", tt.in, got, tt.want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("appendJSON(%v) = %s is not valid JSON", tt.in, got)
		}
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "quote\"back\\slash", "ctl\x00\x1f", "bad\xff\xfe", "\u2028\u2029", "日本語"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("appendString(%q) = %s: %v", s, b, err)
		}
		want, _ := json.Marshal(s) // encoding/json's reading of the same string
		var wantBack string
		_ = json.Unmarshal(want, &wantBack)
		if back != wantBack {
			t.Fatalf("appendString(%q) decodes to %q, want %q", s, back, wantBack)
		}
	})
}

func FuzzJSONStringLen(f *testing.F) {
	for _, s := range []string{"", "plain", "q\"b\\n\n\r\t\x01", "bad\xff", "\u2028", "日本"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := jsonStringLen(s), int64(len(appendString(nil, s))); got != want {
			t.Fatalf("jsonStringLen(%q) = %d, want %d", s, got, want)
		}
	})
}
