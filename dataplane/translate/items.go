package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// buildInput translates the messages into input items (docs/translation.md §4).
func buildInput(req *MessagesRequest, upstream string) []json.RawMessage {
	sysRole := "system"
	if isReasoningModel(upstream) {
		sysRole = "developer"
	}
	items := make([]json.RawMessage, 0, len(req.messages)+4)
	var buf []byte
	for _, m := range req.messages {
		switch m.role {
		case "system":
			for _, b := range m.content {
				if b.typ != "text" || strings.TrimSpace(b.text) == "" {
					continue
				}
				buf = append(buf[:0], `{"content":`...)
				buf = appendString(buf, b.text)
				buf = append(buf, `,"role":`...)
				buf = appendString(buf, sysRole)
				buf = append(buf, '}')
				items = append(items, json.RawMessage(string(buf)))
			}
		case "assistant":
			items = appendAssistant(items, m.content)
		case "user":
			items = appendUser(items, m.content)
		}
	}
	return items
}

// isReasoningModel decides the role of in-conversation system messages:
// developer for reasoning models, system otherwise (docs/translation.md §4.1).
func isReasoningModel(model string) bool {
	switch {
	case strings.HasPrefix(model, "gpt-5-chat"):
		return false
	case strings.HasPrefix(model, "gpt-5"), strings.HasPrefix(model, "o1"),
		strings.HasPrefix(model, "o3"), strings.HasPrefix(model, "o4-mini"):
		return true
	}
	return false
}

// UnsignedThinking is the signature of a thinking block whose reasoning
// item came without encrypted_content: no block is ever sent with an empty
// signature, which the Anthropic API never does, and one with this
// signature is left out when a client sends it back, like one without
// (docs/translation.md §4.4, §9.2).
const UnsignedThinking = "clodex:unsigned"

func appendAssistant(items []json.RawMessage, content []block) []json.RawMessage {
	for _, b := range content {
		var buf []byte
		switch b.typ {
		case "text":
			buf = append(buf, `{"content":[{"text":`...)
			buf = appendString(buf, b.text)
			buf = append(buf, `,"type":"output_text"}],"role":"assistant"}`...)
		case "thinking":
			if b.signature == "" || b.signature == UnsignedThinking {
				continue // not replayable upstream (docs/translation.md §4.4)
			}
			buf = append(buf, `{"encrypted_content":`...)
			buf = appendString(buf, b.signature)
			buf = append(buf, `,"summary":[`...)
			if b.thinking != "" {
				buf = append(buf, `{"text":`...)
				buf = appendString(buf, b.thinking)
				buf = append(buf, `,"type":"summary_text"}`...)
			}
			buf = append(buf, `],"type":"reasoning"}`...)
		case "tool_use":
			buf = append(buf, `{"arguments":`...)
			buf = appendString(buf, b.args)
			buf = append(buf, `,"call_id":`...)
			buf = appendString(buf, stripCallIDSuffix(b.id))
			buf = append(buf, `,"name":`...)
			buf = appendString(buf, b.name)
			buf = append(buf, `,"type":"function_call"}`...)
		default:
			continue
		}
		items = append(items, buf)
	}
	return items
}

func appendUser(items []json.RawMessage, content []block) []json.RawMessage {
	lifted := []byte{'['} // parts lifted out of tool results
	own := []byte{'['}
	for _, b := range content {
		switch b.typ {
		case "text":
			own = appendTextPart(own, b.text)
		case "image":
			own = appendImagePart(own, b)
		case "document":
			own = appendDocumentParts(own, b)
		case "search_result":
			own = appendTextPart(own, searchResultText(b))
		case "tool_reference":
			own = appendTextPart(own, toolReferenceText(b.toolName))
		case "tool_result":
			callID := stripCallIDSuffix(b.toolUseID)
			output := toolResultOutput(b, callID, &lifted)
			buf := []byte(`{"call_id":`)
			buf = appendString(buf, callID)
			buf = append(buf, `,"output":`...)
			buf = appendString(buf, output)
			buf = append(buf, `,"type":"function_call_output"}`...)
			items = append(items, buf)
		}
	}
	if len(lifted) == 1 && len(own) == 1 {
		return items
	}
	buf := []byte(`{"content":`)
	buf = append(buf, lifted...)
	if len(own) > 1 {
		if len(lifted) > 1 {
			buf = append(buf, ',')
		}
		buf = append(buf, own[1:]...)
	}
	buf = append(buf, `],"role":"user"}`...)
	return append(items, buf)
}

func appendTextPart(parts []byte, text string) []byte {
	if len(parts) > 1 {
		parts = append(parts, ',')
	}
	parts = append(parts, `{"text":`...)
	parts = appendString(parts, text)
	return append(parts, `,"type":"input_text"}`...)
}

// toolResultOutput renders a tool_result's content as the
// function_call_output string, lifting images and documents into *lifted
// (docs/translation.md §4.3): the output keeps a note where each was, and the next user
// message carries it, introduced by a line naming the tool call.
func toolResultOutput(b block, callID string, lifted *[]byte) string {
	if b.contentIsStr {
		return b.contentString
	}
	allRefs := len(b.content) > 0
	for _, c := range b.content {
		if c.typ != "tool_reference" {
			allRefs = false
		}
	}
	if allRefs {
		lines := make([]string, len(b.content))
		for i, c := range b.content {
			lines[i] = toolReferenceText(c.toolName)
		}
		return strings.Join(lines, "\n")
	}
	out := []byte{'['}
	images, docs := 0, 0
	for i, c := range b.content {
		if i > 0 {
			out = append(out, ',')
		}
		switch {
		case c.typ == "image":
			images++
			out = liftAttachment(out, lifted, c, images, callID)
		case c.typ == "document":
			docs++
			out = liftAttachment(out, lifted, c, docs, callID)
		case c.typ == "tool_reference":
			out = append(out, `{"type":"text","text":`...)
			out = appendString(out, toolReferenceText(c.toolName))
			out = append(out, '}')
		case c.spaced:
			out = append(out, compactJSON(c.raw)...)
		default:
			out = append(out, c.raw...)
		}
	}
	return string(append(out, ']'))
}

func toolReferenceText(name string) string { return "Tool " + name + " is now available." }

// stripCallIDSuffix removes a thought-signature suffix from a tool_use id.
func stripCallIDSuffix(id string) string {
	if i := strings.Index(id, "__ts__"); i >= 0 {
		id = id[:i]
	}
	if i := strings.Index(id, "::ts::"); i >= 0 {
		id = id[:i]
	}
	return id
}

// OutputItems returns the completed response's output items in the shape
// the client will echo them (the head snapshot of docs/pool.md §4), in output_index
// order, each in canonical form (CanonicalItem). It is nil before the
// response completed.
func (s *Stream) OutputItems() []json.RawMessage {
	if s.state != StateCompleted {
		return nil
	}
	if s.output != nil {
		return s.output
	}
	idx := make([]int, 0, len(s.items))
	for i := range s.items {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	out := make([]json.RawMessage, 0, len(idx))
	for _, i := range idx {
		st := s.items[i]
		if !st.opened && st.done == nil {
			continue // never announced by the upstream
		}
		if item := s.echoItem(st); item != nil {
			if c, err := CanonicalItem(item); err == nil {
				out = append(out, c)
			}
		}
	}
	s.output = out
	return out
}

var ephemeralItemFields = []string{"id", "status", "phase", "role"}

func (s *Stream) echoItem(st *itemState) []byte {
	var done map[string]any
	if len(st.done) > 0 {
		v, _ := decodeAny(st.done)
		done, _ = v.(map[string]any)
	}
	clean := func() map[string]any {
		m := map[string]any{}
		for k, v := range done {
			if v != nil && !slices.Contains(ephemeralItemFields, k) {
				m[k] = v
			}
		}
		return m
	}
	switch st.typ {
	case "message":
		text := string(st.text)
		b := []byte(`{"content":[{"text":`)
		b = appendString(b, text)
		return append(b, `,"type":"output_text"}],"role":"assistant"}`...)
	case "reasoning":
		m := clean()
		m["type"] = "reasoning"
		if len(st.summaries) > 0 {
			sum := make([]any, 0, len(st.summaries))
			for _, t := range st.summaries {
				sum = append(sum, map[string]any{"type": "summary_text", "text": string(t)})
			}
			m["summary"] = sum
		} else if _, ok := m["summary"]; !ok {
			m["summary"] = []any{}
		}
		if st.encrypted != "" {
			m["encrypted_content"] = st.encrypted
		}
		b, _ := marshalNoEscape(m)
		return b
	case "function_call":
		m := clean()
		m["type"] = "function_call"
		m["call_id"] = st.callID
		m["name"] = st.name
		m["arguments"] = sanitizeArguments(string(st.args), s.turn.required[st.name])
		b, _ := marshalNoEscape(m)
		return b
	case "custom_tool_call":
		if done == nil {
			return nil
		}
		b, _ := marshalNoEscape(clean())
		return b
	}
	return nil
}

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

var errTrailingData = errors.New("unexpected data after the JSON value")

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
