package codexsim

import (
	"bytes"
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

// encodingJSON is encoding/json's encoding of s with HTML escaping off,
// the reference appendString must match byte for byte.
func encodingJSON(t testing.TB, s string) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		t.Fatalf("encoding/json: %v", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// trickyStrings are strings whose JSON encodings differ between encoders.
var trickyStrings = []string{
	"", "plain", "quote\"back\\slash",
	"\b\f\n\r\t", "bs\bff\f", "\x00\x01\x07\x0b\x0e\x1b\x1f", "del\x7f",
	"\u2028\u2029", "x\u2028y\u2029z", "<script>&amp;</script>",
	"bad\xff\xfe", "\x80", "cut\xe2\x80", "surrogate\xed\xa0\x80", "overlong\xc0\xaf",
	"\ufffd", "日本語", "emoji 😀", "\u00e9\u0301",
}

func TestJSONStringLenMatchesEncodingJSON(t *testing.T) {
	cases := append([]string(nil), trickyStrings...)
	for c := range 0x20 { // every control character, alone and in text
		cases = append(cases, string(rune(c)), "a"+string(rune(c))+"b")
	}
	for _, s := range cases {
		if got, want := jsonStringLen(s), int64(len(encodingJSON(t, s))); got != want {
			t.Errorf("jsonStringLen(%q) = %d, want %d (encoding/json)", s, got, want)
		}
	}
}

func FuzzJSONStringLen(f *testing.F) {
	for _, s := range []string{"", "plain", "q\"b\\n\n\r\t\x01", "bad\xff", "\u2028", "日本"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := jsonStringLen(s), int64(len(encodingJSON(t, s))); got != want {
			t.Fatalf("jsonStringLen(%q) = %d, want %d", s, got, want)
		}
	})
}
