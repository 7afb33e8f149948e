package translate

import (
	"errors"
	"strings"
	"testing"
)

func TestCountTokens(t *testing.T) {
	img := `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + strings.Repeat("A", 4000) + `"}}`
	tests := []struct {
		name, body string
		want       int
	}{
		{"only dropped fields", `{"model":"m","max_tokens":5,"stream":true,"metadata":{"user_id":"x"},"temperature":1,"top_p":1,"top_k":1,"stop_sequences":["x"]}`, 0},
		// {"messages":[]} is 15 bytes → ceil(15/4) = 4.
		{"small", `{"model":"m","messages":[]}`, 4},
		// {"messages":[{"content":"abcd","role":"user"}]} is 47 bytes → 12.
		{"sorted or not, the length is the same", `{"messages":[{"role":"user","content":"abcd"}]}`, 12},
		// The image becomes {"type":"image"}: {"messages":[{"content":[{"type":"image"}],"role":"user"}]} is 60 bytes → 15 + 1600.
		{"image", `{"messages":[{"role":"user","content":[` + img + `]}]}`, 15 + 1600},
		// Inside a tool result too: {"messages":[{"content":[{"content":[{"type":"image"}],"type":"tool_result"}],"role":"user"}]} = 94 bytes → 24 + 1600.
		{"image in tool result", `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[` + img + `]}]}]}`, 24 + 1600},
		// A multi-byte character counts its UTF-8 bytes: {"system":"é"} is 14 bytes → 4.
		{"utf-8 bytes", `{"system":"é"}`, 4},
		// The last of duplicate keys counts: {"a":22} is 8 bytes → 2.
		{"duplicate keys", `{"a":1,"a":22}`, 2},
		// Escapes are resolved and re-encoded: {"a":"/é\n"} is 14 bytes → 4.
		{"escapes", `{"\u0061" : "\/\u00e9\n"}`, 4},
		// A lone surrogate becomes U+FFFD (3 bytes): {"s":"�"} is 11 bytes → 3.
		{"lone surrogate", `{"s":"\ud800"}`, 3},
		// Numbers stay as written: {"n":1.50} is 10 bytes → 3.
		{"numbers verbatim", `{"n":1.50}`, 3},
		// An image needs an object source: {"messages":[{"source":"x","type":"image"}]} is 44 bytes → 11.
		{"image without object source", `{"messages":[{"type":"image","source":"x"}]}`, 11},
		// What json.Decoder ignored after the object is still ignored: {"a":1} → 2.
		{"closing bracket after the object", `{"a":1} ]`, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CountTokens([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("CountTokens = %d, want %d", got, tt.want)
			}
		})
	}
	for _, bad := range []string{``, `[]`, `{"a":`, `{"a":1}x`, `{"a":1}{}`, `{"a":01}`, `{"a":"\x"}`, "{\"a\":\"\x01\"}"} {
		_, err := CountTokens([]byte(bad))
		var re *RequestError
		if !errors.As(err, &re) {
			t.Errorf("CountTokens(%q) err = %v, want *RequestError", bad, err)
		}
	}
}
