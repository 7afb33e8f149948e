package translate

import (
	"fmt"
	"unicode/utf8"
)

// reqErr is the *RequestError for field with a formatted message.
func reqErr(field, format string, args ...any) *RequestError {
	return &RequestError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// kindNameOf names a value by its first byte (or node kind).
func kindNameOf(k byte) string {
	switch k {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n', 0:
		return "null"
	default:
		return "a number"
	}
}

// bounded shortens a client-supplied value before it is quoted in an
// error message.
func bounded(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}

// placeName names where blocks of place sit, for error messages.
func placeName(place string) string {
	switch place {
	case "tool_result":
		return "a tool_result's content"
	case "document":
		return "a document's content source"
	}
	return place + " messages"
}

// invalidUTF8 is the error for the doc's body that is not valid UTF-8:
// it names the value (or key) holding the first bad byte, the byte and
// its offset.
func (d *jsonDoc) invalidUTF8() *RequestError {
	off := invalidUTF8At(d.src)
	return reqErr(d.pathAt(off), "is not valid UTF-8 (byte 0x%02x at offset %d of the body); send UTF-8 text, escaping other characters as \\uXXXX", d.src[off], off)
}

// invalidUTF8At is the offset of the first byte of body that does not
// start a valid UTF-8 sequence (len(body) when it is valid).
func invalidUTF8At(body []byte) int {
	for i := 0; i < len(body); {
		if body[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(body[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(body)
}

// pathAt names the value or object key of the doc that holds byte offset
// off of src, as the decoding errors name fields ("messages[2].content[0].text";
// "" for the root).
func (d *jsonDoc) pathAt(off int) string {
	path := ""
	n := 0
	for {
		nd := &d.nodes[n]
		if nd.kind != '{' && nd.kind != '[' {
			return path
		}
		next := -1
		i := 0
		for c := nd.first; c >= 0; c, i = d.nodes[c].next, i+1 {
			cn := &d.nodes[c]
			if nd.kind == '[' {
				if off >= cn.start && off < cn.end {
					path, next = indexField(path, i), c
					break
				}
				continue
			}
			name := bounded(string(d.key(c)))
			if path != "" {
				name = path + "." + name
			}
			if off >= cn.keyStart && off < cn.keyEnd {
				return name + " (object key)"
			}
			if off >= cn.start && off < cn.end {
				path, next = name, c
				break
			}
		}
		if next < 0 {
			return path
		}
		n = next
	}
}
