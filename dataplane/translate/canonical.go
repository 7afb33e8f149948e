package translate

import (
	"bytes"
	"encoding/json"
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
