package codexsim

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// canonicalJSON returns raw re-encoded with object keys sorted, no
// insignificant whitespace and no HTML escaping. Numbers keep their text.
func canonicalJSON(raw []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return raw
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return raw
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// tokensOf is the emulator's token count of a JSON value:
// ceil(len(canonical JSON bytes) / 4).
func tokensOf(raw []byte) int64 {
	n := int64(len(canonicalJSON(raw)))
	return (n + 3) / 4
}

// tokensOfString counts a string as its JSON encoding (quotes included),
// without building it: instructions can be tens of megabytes.
func tokensOfString(s string) int64 {
	if s == "" {
		return 0
	}
	return (jsonStringLen(s) + 3) / 4
}

// jsonStringLen is len(jsonstr.Append(nil, s)).
func jsonStringLen(s string) int64 {
	n := int64(2)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f':
				n += 2
			case c < 0x20:
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			n += 6
		case r == '\u2028' || r == '\u2029':
			n += 6
		default:
			n += int64(size)
		}
		i += size
	}
	return n
}

// promptTokens counts the tokens of a request's own parts: its new input
// items, its instructions and its tools.
func promptTokens(req *createRequest) (items, fixed int64) {
	for _, it := range req.Input {
		items += tokensOf(it)
	}
	fixed = tokensOfString(req.Instructions)
	if len(req.Tools) > 0 {
		fixed += tokensOf(req.Tools)
	}
	return items, fixed
}
