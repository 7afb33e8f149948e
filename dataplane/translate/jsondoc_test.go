package translate

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"testing/quick"

	"github.com/clodex/clodex/internal/jsonstr"
)

// The one-pass parser must agree with encoding/json on everything the
// translation relies on. The oracles below are encoding/json itself and
// the generic-value estimate the package used before (decode into
// map[string]any, drop fields, reduce images, marshal, measure).

func referenceEstimate(t testing.TB, body []byte) (int, bool) {
	t.Helper()
	v, err := decodeAny(body)
	if err != nil {
		return 0, false
	}
	m, ok := v.(map[string]any)
	if !ok {
		return 0, false
	}
	for _, k := range countTokensDropped {
		delete(m, k)
	}
	if len(m) == 0 {
		return 0, true
	}
	images := 0
	out, err := marshalNoEscape(referenceReduceImages(m, &images))
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return max(1, (len(out)+3)/4+imageTokens*images), true
}

func referenceReduceImages(v any, images *int) any {
	switch x := v.(type) {
	case map[string]any:
		if x["type"] == "image" {
			if _, ok := x["source"].(map[string]any); ok {
				*images++
				return map[string]any{"type": "image"}
			}
		}
		for k, e := range x {
			x[k] = referenceReduceImages(e, images)
		}
	case []any:
		for i, e := range x {
			x[i] = referenceReduceImages(e, images)
		}
	}
	return v
}

// referenceWire is the struct DecodeRequest used to decode the top level.
type referenceWire struct {
	Model        json.RawMessage `json:"model"`
	Messages     json.RawMessage `json:"messages"`
	MaxTokens    json.RawMessage `json:"max_tokens"`
	System       json.RawMessage `json:"system"`
	Stream       json.RawMessage `json:"stream"`
	Tools        json.RawMessage `json:"tools"`
	ToolChoice   json.RawMessage `json:"tool_choice"`
	Metadata     json.RawMessage `json:"metadata"`
	Thinking     json.RawMessage `json:"thinking"`
	OutputConfig json.RawMessage `json:"output_config"`
	Temperature  json.RawMessage `json:"temperature"`
	Diagnostics  json.RawMessage `json:"diagnostics"`
}

// checkDoc compares every accessor of the parsed data with encoding/json.
func checkDoc(t *testing.T, data []byte) {
	t.Helper()
	d, ok := parseDoc(data, false)
	if ok != json.Valid(data) {
		t.Fatalf("parseDoc ok=%v, json.Valid=%v for %q", ok, !ok, data)
	}
	if jsonKind(data) == '{' {
		// CountTokens' leniency: json.Decoder followed by More and Token.
		_, err := decodeAny(data)
		d2, ok2 := parseDoc(data, true)
		if ok2 {
			d2.release()
		}
		if ok2 != (err == nil) {
			t.Fatalf("lenient parse ok=%v, json.Decoder err=%v for %q", ok2, err, data)
		}
	}
	if !ok {
		return
	}
	defer d.release()
	for i := range d.nodes {
		n := d.nodes[i]
		if n.kind == '"' {
			var want string
			if err := json.Unmarshal(d.raw(i), &want); err != nil {
				t.Fatal(err)
			}
			if got := d.str(i); got != want {
				t.Fatalf("str(%s) = %q, want %q", d.raw(i), got, want)
			}
			if got, want := rawEncodedLen(d.raw(i)), len(jsonstr.Append(nil, want)); got != want {
				t.Fatalf("rawEncodedLen(%s) = %d, want %d", d.raw(i), got, want)
			}
		}
		if n.keyEnd > 0 {
			var want string
			if err := json.Unmarshal(data[n.keyStart:n.keyEnd], &want); err != nil {
				t.Fatal(err)
			}
			if got := string(d.key(i)); got != want {
				t.Fatalf("key %s = %q, want %q", data[n.keyStart:n.keyEnd], got, want)
			}
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, d.raw(i)); err != nil {
			t.Fatal(err)
		}
		if got := d.compact(i); !bytes.Equal(got, compact.Bytes()) {
			t.Fatalf("compact(%s) = %s, want %s", d.raw(i), got, compact.Bytes())
		}
		if n.kind == '{' {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(d.raw(i), &m); err != nil {
				t.Fatal(err)
			}
			for k, v := range m {
				if got := d.get(i, k); got < 0 || !bytes.Equal(d.raw(got), v) {
					t.Fatalf("get(%q) in %s: node %d, want %s", k, d.raw(i), got, v)
				}
			}
			var s struct {
				Required []string `json:"required"`
			}
			want := s.Required
			if json.Unmarshal(d.raw(i), &s) == nil {
				want = s.Required
			}
			got := d.requiredList(i)
			if strings.Join(got, "\x00") != strings.Join(want, "\x00") || len(got) != len(want) {
				t.Fatalf("requiredList(%s) = %q, want %q", d.raw(i), got, want)
			}
		}
	}
	v, err := decodeAny(data)
	if err != nil {
		t.Fatal(err)
	}
	want, err := marshalNoEscape(v)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.appendCanonical(nil, 0); !bytes.Equal(got, want) {
		t.Fatalf("appendCanonical(%s)\n got %s\nwant %s", data, got, want)
	}
	if d.kind(0) == '{' {
		var w referenceWire
		if err := json.Unmarshal(data, &w); err != nil {
			t.Fatal(err)
		}
		wire := d.wire()
		for f, raw := range []json.RawMessage{w.Model, w.Messages, w.MaxTokens, w.System, w.Stream, w.Tools, w.ToolChoice, w.Metadata, w.Thinking, w.OutputConfig, w.Temperature, w.Diagnostics} {
			got := wire[f]
			if (got < 0) != (raw == nil) || got >= 0 && !bytes.Equal(d.raw(got), raw) {
				t.Fatalf("field %s of %s: node %d, want %s", wireFields[f], data, got, raw)
			}
		}
		wantN, _ := referenceEstimate(t, data)
		if got := d.estimate(); got != wantN {
			t.Fatalf("estimate(%s) = %d, want %d", data, got, wantN)
		}
	}
}

var jsonDocSeeds = []string{
	`{}`, `[]`, `""`, `0`, `-0.5e+10`, `true`, `null`, ` {"a" : [1, 2 ,{ }] } `,
	`{"a":1,"a":2}`, `{"a":{"x":1},"A":2,"b\u0041":3}`, `{"MODEL":"m","model":"n","Max_Tokens":5}`,
	`"\ud83d\ude00 \ud800 \udc00x \ud800\u0041 \u2028 \u00e9 \/ \b\f\n\r\t \u0000 \u001f"`,
	"\"\xff\xfe bad utf8 \xed\xa0\x80 é\"",
	`{"type":"image","source":{}}`, `{"type":"image","source":[]}`, `{"t":[{"type":"image","source":{"a":1}},{"type":"imag\u0065","source":{}}]}`,
	`{"model":"m","max_tokens":1}`, `{"messages":[],"model":"x"}`,
	`{"required":["a",null]}`, `{"required":["a",1]}`, `{"required":"a"}`, `{"required":null}`, `{"required":[]}`,
	`{"Required":["a"],"required":["b"]}`, `{"required":["a"],"required":[1]}`, `{"REQUIRED":["x"]}`,
	`{"n":12345678901234567890,"f":1.50,"s":"<&>"}`,
	`{"a":1}]`, `{"a":1}}`, `{"a":1} x`, `{"a":1}{}`, `01`, `1.`, `-`, `1e`, `tru`, `"\u12"`, `"\x"`, "\"a\tb\"",
	`{"k":"v",}`, `[1,]`, `{"a"}`, `{1:2}`, ``, ` `,
}

func TestJSONDocAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range jsonDocSeeds {
		checkDoc(t, []byte(s))
	}
	for _, name := range []string{"cc-2.1.332-messages-request-custom-model.json", "cc-2.1.197-interactive-request.json"} {
		checkDoc(t, fixtureBody(t, name))
	}
	checkDoc(t, paddedFirstTurn(t, 88<<10))
	checkDoc(t, []byte(mixedBody))
}

func TestJSONDocNestingLimit(t *testing.T) {
	for _, depth := range []int{maxNestingDepth, maxNestingDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			closeCh := "]"
			if open != "[" {
				closeCh = "}"
			}
			data := []byte(strings.Repeat(open, depth) + "0" + strings.Repeat(closeCh, depth))
			_, ok := parseDoc(data, false)
			if want := depth <= maxNestingDepth; ok != want || json.Valid(data) != want {
				t.Errorf("depth %d %q: parseDoc %v, json.Valid %v, want %v", depth, open, ok, json.Valid(data), want)
			}
		}
	}
}

func TestPlainASCII(t *testing.T) {
	tests := []struct {
		s    string
		want int
	}{
		{"", 0},
		{"abcdefghijklmnop", 16},
		{"abcdefgh\"", 8},
		{"abcdefg\\h", 7},
		{"abcdefghijk\x1f", 11},
		{"abc\x7fdefghijk", 11 + 1}, // DEL is printable for JSON
		{"abcdefghé", 8},
		{"ab\x00", 2},
		{"ab ! ~ ", 7},
	}
	for _, tt := range tests {
		if got := jsonstr.Plain(tt.s, 0); got != tt.want {
			t.Errorf("jsonstr.Plain(%q) = %d, want %d", tt.s, got, tt.want)
		}
		if got := jsonstr.Plain([]byte(tt.s), 0); got != tt.want {
			t.Errorf("jsonstr.Plain([]byte %q) = %d, want %d", tt.s, got, tt.want)
		}
	}
}

func FuzzJSONDoc(f *testing.F) {
	for _, s := range jsonDocSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDoc(t, data)
		n, err := CountTokens(data)
		want, ok := referenceEstimate(t, data)
		if ok != (err == nil) || ok && n != want {
			t.Fatalf("CountTokens(%q) = %d, %v; reference %d, %v", data, n, err, want, ok)
		}
	})
}
func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	cases := []string{"", "plain", "a\"b\\c", "\x00\x01\x1f\b\f\n\r\t\x7f", "é世界🎉", "\u2028\u2029", "<&>", "\xff\xfe bad", "a\xe2\x82"}
	check := func(s string) bool {
		want, err := marshalNoEscape(s)
		return err == nil && string(jsonstr.Append(nil, s)) == string(want)
	}
	for _, c := range cases {
		if !check(c) {
			want, _ := marshalNoEscape(c)
			t.Errorf("jsonstr.Append(%q) = %s, encoding/json %s", c, jsonstr.Append(nil, c), want)
		}
	}
	if err := quick.Check(check, &quick.Config{MaxCount: 2000}); err != nil {
		t.Error(err)
	}
	bytesCheck := func(b []byte) bool { return check(string(b)) }
	if err := quick.Check(bytesCheck, &quick.Config{MaxCount: 2000}); err != nil {
		t.Error(err)
	}
}
