package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// CanonicalItem returns the canonical form of one conversation item, used
// to compare a retained head's history with an incoming request
// (docs/pool.md §3.1): object keys sorted recursively, no insignificant whitespace, nulls
// kept; function_call arguments (and custom_tool_call input) replaced by
// their canonical JSON when they parse; a reasoning item loses an empty
// content array, and its summary when encrypted_content is set. Two items
// are equal for prefix matching when their canonical forms are byte-equal.
func CanonicalItem(item json.RawMessage) ([]byte, error) {
	v, err := decodeAny(item)
	if err != nil {
		return nil, fmt.Errorf("canonical item: %w", err)
	}
	if m, ok := v.(map[string]any); ok {
		canonicalizeItem(m)
	}
	out, err := marshalNoEscape(v)
	if err != nil {
		return nil, fmt.Errorf("canonical item: %w", err)
	}
	return out, nil
}

func canonicalizeItem(m map[string]any) {
	switch m["type"] {
	case "function_call":
		canonicalizeJSONString(m, "arguments")
	case "custom_tool_call":
		canonicalizeJSONString(m, "input")
	case "reasoning":
		if c, ok := m["content"].([]any); ok && len(c) == 0 {
			delete(m, "content")
		}
		if e, ok := m["encrypted_content"].(string); ok && e != "" {
			delete(m, "summary")
		}
	}
}

func canonicalizeJSONString(m map[string]any, key string) {
	s, ok := m[key].(string)
	if !ok {
		return
	}
	v, err := decodeAny([]byte(s))
	if err != nil {
		return
	}
	if out, err := marshalNoEscape(v); err == nil {
		m[key] = string(out)
	}
}

// sanitizeArguments applies the tool-input filler strip (docs/translation.md §9.4) to a
// function call's arguments and returns the downstream JSON text: trimmed,
// empty → {}; for a JSON object, top-level keys whose value is null are
// dropped, and keys whose value is an empty array unless required lists
// them; key order is kept. Text that is not a JSON object is returned
// compacted when it parses, else unchanged.
func sanitizeArguments(args string, required []string) string {
	t := bytes.TrimSpace([]byte(args))
	if len(t) == 0 {
		return "{}"
	}
	if !json.Valid(t) {
		return args
	}
	if t[0] != '{' {
		return string(compactJSON(t))
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	if _, err := dec.Token(); err != nil { // '{'
		return string(compactJSON(t))
	}
	out := make([]byte, 0, len(t))
	out = append(out, '{')
	first := true
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return string(compactJSON(t))
		}
		key, _ := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return string(compactJSON(t))
		}
		switch jsonKind(val) {
		case 'n':
			continue
		case '[':
			if isEmptyArray(val) && !slices.Contains(required, key) {
				continue
			}
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = appendString(out, key)
		out = append(out, ':')
		out = append(out, compactJSON(val)...)
	}
	return string(append(out, '}'))
}

func isEmptyArray(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	if len(t) < 2 || t[0] != '[' || t[len(t)-1] != ']' {
		return false
	}
	return len(bytes.TrimSpace(t[1:len(t)-1])) == 0
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

var errTrailingData = errors.New("unexpected data after the JSON value")

// appendCanonical appends value i re-encoded as encoding/json encodes its
// generic decoding (numbers kept as written): object keys sorted, the last
// duplicate kept, no whitespace, HTML characters not escaped.
func (d *jsonDoc) appendCanonical(dst []byte, i int) []byte {
	n := &d.nodes[i]
	switch n.kind {
	case '"':
		if n.flags&flagEscaped == 0 {
			return append(dst, d.src[n.start:n.end]...)
		}
		d.scratch = unquoteTo(d.scratch[:0], d.src[n.start:n.end])
		return appendString(dst, string(d.scratch))
	case '[':
		dst = append(dst, '[')
		for c := n.first; c >= 0; c = d.nodes[c].next {
			if c != n.first {
				dst = append(dst, ',')
			}
			dst = d.appendCanonical(dst, c)
		}
		return append(dst, ']')
	case '{':
		ms, base := d.members(i)
		slices.SortFunc(ms, func(a, b jmember) int { return cmpString(a.key, b.key) })
		dst = append(dst, '{')
		for j, m := range ms {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, m.key)
			dst = append(dst, ':')
			dst = d.appendCanonical(dst, m.node)
		}
		d.keys = d.keys[:base]
		return append(dst, '}')
	default:
		return append(dst, d.src[n.start:n.end]...)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// members pushes onto d.keys the members of object i that decoding into a
// map keeps (the last of each key), in document order, with their decoded
// keys, and returns them; the caller pops them with d.keys = d.keys[:base]
// when done (nested calls push after them).
func (d *jsonDoc) members(i int) (ms []jmember, base int) {
	base = len(d.keys)
	for c := d.nodes[i].first; c >= 0; c = d.nodes[c].next {
		n := &d.nodes[c]
		var k string
		if n.flags&flagKeyEscaped == 0 {
			k = bstr(d.src[n.keyStart+1 : n.keyEnd-1])
		} else {
			k = string(d.key(c))
		}
		d.keys = append(d.keys, jmember{node: c, key: k})
	}
	ms = d.keys[base:]
	if len(ms) > 1 {
		kept := dedup(ms)
		d.keys = d.keys[:base+len(kept)]
		ms = d.keys[base:]
	}
	return ms, base
}

type jmember struct {
	node int
	key  string // decoded key
}

// dedup drops, in place, members whose key appears again later.
func dedup(ms []jmember) []jmember {
	dup := false
	if len(ms) <= 16 {
		for a := range ms {
			for b := a + 1; b < len(ms); b++ {
				if ms[a].key == ms[b].key {
					dup = true
				}
			}
		}
	} else {
		seen := make(map[string]struct{}, len(ms))
		for _, m := range ms {
			if _, ok := seen[m.key]; ok {
				dup = true
				break
			}
			seen[m.key] = struct{}{}
		}
	}
	if !dup {
		return ms
	}
	last := make(map[string]int, len(ms))
	for j, m := range ms {
		last[m.key] = j
	}
	out := ms[:0]
	for j, m := range ms {
		if last[m.key] == j {
			out = append(out, m)
		}
	}
	return out
}
