// Package jsonstr is the one JSON string writer of clodex, and the
// eight-bytes-at-a-time scan both it and the data plane's parser use:
//
//	b = jsonstr.Append(b, s)   // "s", byte for byte as encoding/json writes it with HTML escaping off
//	i = jsonstr.Plain(s, i)    // the next byte from i on that a JSON string cannot hold as it is
//	m := jsonstr.Special(jsonstr.Load64(s, i)) // non-zero when one of those 8 bytes is below 0x20, '"' or '\\'
//
// dataplane/translate writes every frame and SSE event with it, and
// clodex-sim (internal/codexsim) its events, so the two agree byte for
// byte.
package jsonstr

import "unicode/utf8"

// ones has a 1 in every byte; High is the high bit of every byte (a byte
// at or above 0x80 is not ASCII).
const (
	ones = 0x0101010101010101
	High = 0x8080808080808080
)

// Load64 reads 8 bytes of s at i, little-endian.
func Load64[T string | []byte](s T, i int) uint64 {
	_ = s[i+7]
	return uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
		uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
}

// Special is non-zero when a byte of x is below 0x20, '"' or '\\'
// (the bytes a JSON string cannot hold as they are).
func Special(x uint64) uint64 {
	q := x ^ (ones * '"')
	b := x ^ (ones * '\\')
	return ((x-ones*0x20)&^x | (q-ones)&^q | (b-ones)&^b) & High
}

// Plain returns the first index from i on where s holds a byte that
// is not printable ASCII other than '"' and '\\' (or len(s)), eight bytes
// at a time.
func Plain[T string | []byte](s T, i int) int {
	for i+8 <= len(s) {
		x := Load64(s, i)
		if Special(x)|x&High != 0 {
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

const hexDigits = "0123456789abcdef"

// Append appends s as a JSON string literal, byte-for-byte as
// encoding/json does with HTML escaping off: invalid UTF-8 becomes U+FFFD
// (so the output is always valid UTF-8), U+2028 and U+2029 are escaped.
func Append(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if i = Plain(s, i); i >= len(s) {
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
