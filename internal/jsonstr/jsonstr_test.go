package jsonstr_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/clodex/clodex/internal/jsonstr"
)

// encodingJSON is s as encoding/json writes it with HTML escaping off: the
// reference Append must match byte for byte.
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

// tricky are strings whose JSON encodings differ between encoders.
var tricky = []string{
	"", "plain", "quote\"back\\slash",
	"\b\f\n\r\t", "bs\bff\f", "\x00\x01\x07\x0b\x0e\x1b\x1f", "del\x7f",
	"\u2028\u2029", "x\u2028y\u2029z", "<script>&amp;</script>",
	"bad\xff\xfe", "\x80", "cut\xe2\x80", "surrogate\xed\xa0\x80", "overlong\xc0\xaf",
	"\ufffd", "日本語", "emoji 😀", "\u00e9\u0301",
	"sixteen plain b\"", "eight by" + "\n", strings.Repeat("long plain run ", 10) + "\t",
}

func TestAppendMatchesEncodingJSON(t *testing.T) {
	cases := append([]string(nil), tricky...)
	for c := range 0x20 { // every control character, alone and in text
		cases = append(cases, string(rune(c)), "a"+string(rune(c))+"b", "12345678"+string(rune(c))+"b")
	}
	for _, s := range cases {
		if got, want := jsonstr.Append(nil, s), encodingJSON(t, s); !bytes.Equal(got, want) {
			t.Errorf("Append(%q) = %s, want %s (encoding/json)", s, got, want)
		}
	}
	// Appending keeps what the buffer held.
	if got := string(jsonstr.Append([]byte("x:"), "\b")); got != `x:"\b"` {
		t.Errorf(`Append("x:", "\b") = %s, want x:"\b"`, got)
	}
}

// Plain stops at the first byte a JSON string cannot hold as it is, or at
// a non-ASCII byte, whichever the 8-byte scan or the tail meets.
func TestPlain(t *testing.T) {
	for _, tt := range []struct {
		s    string
		from int
		want int
	}{
		{"", 0, 0},
		{"abc", 0, 3},
		{"abcdefghijklmnop", 0, 16},
		{"abcdefgh\"ijklmnop", 0, 8},
		{"abcdefghijklmno\\", 0, 15},
		{"abcdefghijklmnop\x1f", 0, 16},
		{"abcdefgh\xc3\xa9", 0, 8},
		{"a\nbcdefghijk", 2, 12},
		{"\x00", 0, 0},
	} {
		if got := jsonstr.Plain(tt.s, tt.from); got != tt.want {
			t.Errorf("Plain(%q, %d) = %d, want %d", tt.s, tt.from, got, tt.want)
		}
		if got := jsonstr.Plain([]byte(tt.s), tt.from); got != tt.want {
			t.Errorf("Plain([]byte(%q), %d) = %d, want %d", tt.s, tt.from, got, tt.want)
		}
	}
}

func FuzzAppend(f *testing.F) {
	for _, s := range tricky {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := jsonstr.Append(nil, s)
		if want := encodingJSON(t, s); !bytes.Equal(got, want) {
			t.Fatalf("Append(%q) = %s, want %s (encoding/json)", s, got, want)
		}
		if !utf8.Valid(got) {
			t.Fatalf("Append(%q) = %q is not valid UTF-8", s, got)
		}
	})
}
