package translate

import (
	"slices"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/clodex/clodex/internal/jsonstr"
)

// countTokensDropped are the body fields the local estimate ignores
// (docs/translation.md §10).
var countTokensDropped = []string{"model", "stream", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "metadata"}

// imageTokens is the flat cost of one image in the local estimate.
const imageTokens = 1600

// CountTokens returns the local token estimate of an Anthropic request body
// (docs/translation.md §10), as served by /v1/messages/count_tokens: the body without
// model, stream, max_tokens, temperature, top_p, top_k, stop_sequences and
// metadata is serialised with every image block reduced to
// {"type":"image"}; the estimate is 0 for an empty object, else
// max(1, ceil(bytes/4) + 1600 per image). A body that is not a JSON object
// yields a *RequestError.
//
// The serialisation is that of the body's generic decoding (keys sorted,
// the last of duplicate keys kept, strings re-encoded, numbers as written);
// only its length matters, so it is computed without building it.
func CountTokens(body []byte) (int, error) {
	if jsonKind(body) != '{' {
		return 0, reqErr("", "Invalid JSON body: the request body must be a JSON object")
	}
	// Data after the object that starts with ']' or '}' has always been
	// ignored here (json.Decoder semantics); keep accepting it.
	d, ok := parseDoc(body, true)
	if !ok {
		return 0, reqErr("", "Invalid JSON body: the request body is not valid JSON")
	}
	defer d.release()
	return d.estimate(), nil
}

// DecodeCountTokens decodes and validates a count_tokens body: the rules
// of DecodeRequest, except that max_tokens is optional.
func DecodeCountTokens(body []byte) (*MessagesRequest, error) {
	return decodeRequest(body, false)
}

// EstimatedTokens is the local estimate of the request body (docs/translation.md §10), what
// count_tokens answers.
func (r *MessagesRequest) EstimatedTokens() int { return r.estimate }

// estimate is the count_tokens estimate of the parsed object d.
func (d *jsonDoc) estimate() int {
	images := 0
	root := 0
	ms, base := d.members(root)
	kept := 0
	for _, m := range ms {
		if !isDroppedKey(m.key) {
			kept++
		}
	}
	d.keys = d.keys[:base]
	if kept == 0 {
		return 0
	}
	n := d.estimateLen(root, &images, countTokensDropped)
	return max(1, (n+3)/4+imageTokens*images)
}

func isDroppedKey(k string) bool {
	for _, d := range countTokensDropped {
		if k == d {
			return true
		}
	}
	return false
}

// estimateLen returns the length of value i serialised as the count_tokens
// estimate serialises it (its generic decoding re-encoded, every image
// block reduced to {"type":"image"}), counting the images; drop lists keys
// left out of this object (not of nested ones).
func (d *jsonDoc) estimateLen(i int, images *int, drop []string) int {
	n := &d.nodes[i]
	switch n.kind {
	case '"':
		return d.strEncodedLen(n.start, n.end, n.flags&flagEscaped != 0)
	case '[':
		size, count := 2, 0
		for c := n.first; c >= 0; c = d.nodes[c].next {
			size += d.estimateLen(c, images, nil)
			count++
		}
		if count > 1 {
			size += count - 1
		}
		return size
	case '{':
		ms, base := d.members(i)
		defer func() { d.keys = d.keys[:base] }()
		if len(drop) > 0 {
			kept := ms[:0]
			for _, m := range ms {
				if !slices.Contains(drop, m.key) {
					kept = append(kept, m)
				}
			}
			ms = kept
		}
		typ, source := -1, -1
		for _, m := range ms {
			switch m.key {
			case "type":
				typ = m.node
			case "source":
				source = m.node
			}
		}
		if d.strEq(typ, "image") && d.kind(source) == '{' {
			*images++
			return len(`{"type":"image"}`)
		}
		size := 2
		if len(ms) > 1 {
			size += len(ms) - 1
		}
		for _, m := range ms {
			c := &d.nodes[m.node]
			size += d.strEncodedLen(c.keyStart, c.keyEnd, c.flags&flagKeyEscaped != 0) + 1
			size += d.estimateLen(m.node, images, nil)
		}
		return size
	default:
		return n.end - n.start
	}
}

// strEncodedLen is the length of the string literal src[start:end]
// re-encoded (appendString) after decoding (unquoteTo), computed from the
// literal without decoding it.
func (d *jsonDoc) strEncodedLen(start, end int, escaped bool) int {
	if !escaped {
		return end - start
	}
	return rawEncodedLen(d.src[start:end])
}

// rawEncodedLen is len(jsonstr.Append(nil, string(unquoteTo(nil, lit)))).
func rawEncodedLen(lit []byte) int {
	s := lit[1 : len(lit)-1]
	n := 2
	for i := 0; i < len(s); {
		if j := jsonstr.Plain(s, i); j > i {
			n += j - i
			if i = j; i >= len(s) {
				break
			}
		}
		c := s[i]
		switch {
		case c == '\\':
			i++
			switch e := s[i]; e {
			case 'u':
				r := hex4(s[i+1:])
				i += 5
				if utf16.IsSurrogate(r) {
					if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
						if dec := utf16.DecodeRune(r, hex4(s[i+2:])); dec != utf8.RuneError {
							n += utf8.RuneLen(dec)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				n += runeEncodedLen(r)
				continue
			case '/':
				n++
			default: // " \ b f n r t
				n += 2
			}
			i++
		case c < utf8.RuneSelf:
			n += runeEncodedLen(rune(c))
			i++
		default:
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				n += 3 // decoded to a valid U+FFFD
			} else {
				n += runeEncodedLen(r)
			}
			i += size
		}
	}
	return n
}

// runeEncodedLen is the length appendString gives the valid rune r.
func runeEncodedLen(r rune) int {
	if r < utf8.RuneSelf {
		switch {
		case r >= 0x20 && r != '"' && r != '\\':
			return 1
		case r == '"', r == '\\', r == '\n', r == '\r', r == '\t', r == '\b', r == '\f':
			return 2
		}
		return 6
	}
	if r == '\u2028' || r == '\u2029' {
		return 6
	}
	return utf8.RuneLen(r)
}

// strEq reports whether string node i decodes to s.
func (d *jsonDoc) strEq(i int, s string) bool {
	if d.kind(i) != '"' {
		return false
	}
	n := &d.nodes[i]
	if n.flags&flagEscaped == 0 {
		return string(d.src[n.start+1:n.end-1]) == s
	}
	d.scratch = unquoteTo(d.scratch[:0], d.src[n.start:n.end])
	return string(d.scratch) == s
}
