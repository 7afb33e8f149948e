package translate

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// jsonKind returns the first significant byte of a JSON value, or 0 when
// raw is empty or all whitespace.
func jsonKind(raw json.RawMessage) byte {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c
	}
	return 0
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string literal, byte-for-byte as
// encoding/json does with HTML escaping off: invalid UTF-8 becomes U+FFFD
// (so the output is always valid UTF-8), U+2028 and U+2029 are escaped.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if i = plainASCII(s, i); i >= len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendInt appends the decimal form of n.
func appendInt(dst []byte, n int) []byte { return strconv.AppendInt(dst, int64(n), 10) }

// compactJSON returns raw without insignificant whitespace. Raw must be
// valid JSON (it came out of the decoder).
func compactJSON(raw json.RawMessage) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return append([]byte(nil), raw...)
	}
	return b.Bytes()
}

// marshalNoEscape marshals v without HTML escaping and without the
// trailing newline json.Encoder adds.
func marshalNoEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	out := b.Bytes()
	return out[:len(out)-1], nil
}

// decodeAny decodes raw into generic values, keeping numbers exact.
func decodeAny(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errTrailingData
	}
	if _, err := dec.Token(); err == nil {
		return nil, errTrailingData
	}
	return v, nil
}

const (
	swarOnes = 0x0101010101010101
	swarHigh = 0x8080808080808080
)

// load64 reads 8 bytes of s at i, little-endian.
func load64[T string | []byte](s T, i int) uint64 {
	_ = s[i+7]
	return uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
		uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
}

// specialMask is non-zero when a byte of x is below 0x20, '"' or '\\'
// (the bytes a JSON string cannot hold as they are).
func specialMask(x uint64) uint64 {
	q := x ^ (swarOnes * '"')
	b := x ^ (swarOnes * '\\')
	return ((x-swarOnes*0x20)&^x | (q-swarOnes)&^q | (b-swarOnes)&^b) & swarHigh
}

// plainASCII returns the first index from i on where s holds a byte that
// is not printable ASCII other than '"' and '\\' (or len(s)), eight bytes
// at a time.
func plainASCII[T string | []byte](s T, i int) int {
	for i+8 <= len(s) {
		x := load64(s, i)
		if specialMask(x)|x&swarHigh != 0 {
			break
		}
		i += 8
	}
	for i < len(s) {
		c := s[i]
		if c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			return i
		}
		i++
	}
	return i
}
