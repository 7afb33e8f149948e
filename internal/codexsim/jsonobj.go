package codexsim

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// obj is a JSON object that keeps its keys in order, so events start with
// "type" as the real backend's do. It encodes without reflection.
type obj []field

type field struct {
	k string
	v any
}

// set replaces the value of key k, or appends it.
func (o obj) set(k string, v any) obj {
	for i := range o {
		if o[i].k == k {
			o[i].v = v
			return o
		}
	}
	return append(o, field{k, v})
}

// MarshalJSON implements json.Marshaler.
func (o obj) MarshalJSON() ([]byte, error) { return appendJSON(nil, o), nil }

// appendJSON appends the JSON encoding of v to b. It handles the types the
// emulator builds events from and falls back to encoding/json for others.
func appendJSON(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...)
	case string:
		return appendString(b, v)
	case bool:
		return strconv.AppendBool(b, v)
	case int:
		return strconv.AppendInt(b, int64(v), 10)
	case int64:
		return strconv.AppendInt(b, v, 10)
	case obj:
		b = append(b, '{')
		for i, f := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, f.k)
			b = append(b, ':')
			b = appendJSON(b, f.v)
		}
		return append(b, '}')
	case []obj:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSON(b, e)
		}
		return append(b, ']')
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSON(b, e)
		}
		return append(b, ']')
	default:
		enc, err := json.Marshal(v)
		if err != nil {
			return append(b, "null"...)
		}
		return append(b, enc...)
	}
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string, byte for byte as encoding/json
// writes it with HTML escaping off: ", \\, \b, \f, \n, \r and \t get their
// short escapes, the other control characters and U+2028, U+2029 are
// written \u00XX and \u202X, and each byte of invalid UTF-8 becomes \ufffd.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
