package translate

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MessagesRequest is a decoded and validated Anthropic Messages request
// body. Fields the translation does not use are not kept; tool schemas and
// tool_result blocks keep their raw JSON so they can be forwarded verbatim.
type MessagesRequest struct {
	estimate int // count_tokens estimate of the body (docs/translation.md §10)

	model          string
	maxTokens      int
	stream         bool
	system         []string // text of each system block (a string system is one block)
	messages       []message
	tools          []tool
	toolChoice     *toolChoice
	metadataUserID string
	thinkingType   string
	thinkingBudget int
	effort         string // output_config.effort, trimmed ("" when absent)
	format         []byte // the text.format of output_config.format or output_format, nil when absent
	hasDiagnostics bool
}

type message struct {
	role    string // user, assistant or system
	content []block
}

// block is one content block. Only the fields of its type are set.
type block struct {
	typ    string
	raw    json.RawMessage // the block object as sent (shares the body's memory)
	spaced bool            // raw holds insignificant whitespace

	text string // text

	// image, document
	sourceType, mediaType, data, url string

	// document (also uses sourceType, mediaType, data, url; a content
	// source keeps its blocks in content)
	title, context string

	// search_result
	source string

	// tool_use
	id, name string
	args     string // input re-encoded canonically (the function_call arguments)

	// tool_result
	toolUseID     string
	contentString string
	contentIsStr  bool
	content       []block

	// thinking
	thinking, signature string

	// tool_reference
	toolName string
}

type tool struct {
	name        string
	description string
	schema      json.RawMessage // compact input_schema (may share the body's memory)
	deferred    bool
	server      bool // a typed server tool (no input_schema): never sent upstream
	required    []string
}

type toolChoice struct {
	typ                    string
	name                   string
	disableParallelToolUse bool
}

// Stream reports whether the client asked for an SSE response.
func (r *MessagesRequest) Stream() bool { return r.stream }

// Model is the model name the client requested, verbatim.
func (r *MessagesRequest) Model() string { return r.model }

// MaxTokens is the client's max_tokens (not sent upstream; docs/translation.md §1.2).
func (r *MessagesRequest) MaxTokens() int { return r.maxTokens }

// wireFields are the top-level fields DecodeRequest reads, matched as
// encoding/json matches struct fields (exact, else case-insensitive; the
// last match wins).
var wireFields = [...]string{"model", "messages", "max_tokens", "system", "stream", "tools", "tool_choice", "metadata", "thinking", "output_config", "temperature", "diagnostics", "output_format"}

const (
	wModel = iota
	wMessages
	wMaxTokens
	wSystem
	wStream
	wTools
	wToolChoice
	wMetadata
	wThinking
	wOutputConfig
	wTemperature
	wDiagnostics
	wOutputFormat
)

// wireRequest holds the node of each top-level field, -1 when absent.
type wireRequest [len(wireFields)]int

func (d *jsonDoc) wire() wireRequest {
	var w wireRequest
	for i := range w {
		w[i] = -1
	}
	for c := d.nodes[0].first; c >= 0; c = d.nodes[c].next {
		k := d.key(c)
		matched := false
		for f, name := range wireFields {
			if string(k) == name {
				w[f], matched = c, true
				break
			}
		}
		if matched {
			continue
		}
		for f, name := range wireFields {
			if bytes.EqualFold(k, []byte(name)) {
				w[f] = c
				break
			}
		}
	}
	return w
}

// DecodeRequest decodes and validates an Anthropic Messages request body.
// model, messages and max_tokens are required. The request may share
// memory with body: do not modify it afterwards. Bad input of any kind
// yields a *RequestError naming the offending field; it never panics.
//
// Everything the upstream would certainly reject is refused here, before
// any socket: an empty messages list, an empty content array (except for a
// final assistant message), a content block type that cannot be carried
// where it sits (see the package doc), an image that is not PNG, JPEG, GIF
// or WebP, a source that is missing its data or is not base64, a URL that
// is not http(s), a document source the upstream cannot read.
func DecodeRequest(body []byte) (*MessagesRequest, error) {
	return decodeRequest(body, true)
}

func decodeRequest(body []byte, needMaxTokens bool) (*MessagesRequest, error) {
	if jsonKind(body) != '{' {
		if !validJSON(body) {
			return nil, reqErr("", "Invalid JSON body: the request body must be a JSON object")
		}
		return nil, reqErr("", "the request body must be a JSON object")
	}
	d, ok := parseDoc(body, false)
	if !ok {
		return nil, reqErr("", "Invalid JSON body: the request body is not valid JSON")
	}
	defer d.release()
	if !utf8.Valid(body) {
		// encoding/json would turn the bytes into U+FFFD silently; the
		// client would get an answer to a text it did not send.
		return nil, d.invalidUTF8()
	}
	w := d.wire()
	r := &MessagesRequest{}
	var err error
	if d.null(w[wModel]) {
		return nil, reqErr("model", "field required")
	}
	if r.model, err = d.decodeString(w[wModel], "model"); err != nil {
		return nil, err
	}
	if r.model == "" {
		return nil, reqErr("model", "must be a non-empty string")
	}
	switch {
	case d.null(w[wMaxTokens]) && needMaxTokens:
		return nil, reqErr("max_tokens", "field required")
	case !d.null(w[wMaxTokens]):
		if r.maxTokens, err = d.decodeInt(w[wMaxTokens], "max_tokens"); err != nil {
			return nil, err
		}
		if r.maxTokens < 1 {
			return nil, reqErr("max_tokens", "must be an integer of at least 1")
		}
	}
	if d.null(w[wMessages]) {
		return nil, reqErr("messages", "field required")
	}
	if r.messages, err = d.decodeMessages(w[wMessages]); err != nil {
		return nil, err
	}
	if err := r.decodeOptional(d, &w); err != nil {
		return nil, err
	}
	r.estimate = d.estimate()
	return r, nil
}

func (r *MessagesRequest) decodeOptional(d *jsonDoc, w *wireRequest) error {
	var err error
	if !d.null(w[wStream]) {
		if r.stream, err = d.decodeBool(w[wStream], "stream"); err != nil {
			return err
		}
	}
	if !d.null(w[wSystem]) {
		if r.system, err = d.decodeSystem(w[wSystem]); err != nil {
			return err
		}
	}
	if !d.null(w[wTools]) {
		if r.tools, err = d.decodeTools(w[wTools]); err != nil {
			return err
		}
	}
	if !d.null(w[wToolChoice]) {
		if r.toolChoice, err = d.decodeToolChoice(w[wToolChoice]); err != nil {
			return err
		}
	}
	if m := w[wMetadata]; !d.null(m) {
		if d.kind(m) != '{' {
			return reqErr("metadata", "must be an object")
		}
		if u := d.getFold(m, "user_id"); !d.null(u) {
			if r.metadataUserID, err = d.decodeString(u, "metadata.user_id"); err != nil {
				return err
			}
		}
	}
	if th := w[wThinking]; !d.null(th) {
		if d.kind(th) != '{' {
			return reqErr("thinking", "must be an object")
		}
		typ, budget := d.getFold(th, "type"), d.getFold(th, "budget_tokens")
		if d.null(typ) {
			return reqErr("thinking.type", "field required; allowed: enabled, disabled, adaptive")
		}
		if r.thinkingType, err = d.decodeString(typ, "thinking.type"); err != nil {
			return err
		}
		if !d.null(budget) {
			if r.thinkingBudget, err = d.decodeInt(budget, "thinking.budget_tokens"); err != nil {
				return err
			}
		}
		if r.thinkingType == "enabled" && d.null(budget) {
			return reqErr("thinking.budget_tokens", "field required when thinking.type is enabled")
		}
	}
	if err := r.decodeOutputConfig(d, w); err != nil {
		return err
	}
	if t := w[wTemperature]; !d.null(t) {
		if k := d.kind(t); k != '-' && k != '0' {
			return reqErr("temperature", "must be a number")
		}
	}
	r.hasDiagnostics = !d.null(w[wDiagnostics])
	return nil
}

func trimSpace(s string) string { return string(bytes.TrimSpace([]byte(s))) }

func (d *jsonDoc) decodeString(i int, field string) (string, error) {
	if d.kind(i) != '"' {
		return "", reqErr(field, "must be a string, got %s", kindNameOf(d.kind(i)))
	}
	return d.str(i), nil
}

func (d *jsonDoc) decodeBool(i int, field string) (bool, error) {
	switch d.kind(i) {
	case 't':
		return true, nil
	case 'f':
		return false, nil
	}
	return false, reqErr(field, "must be a boolean, got %s", kindNameOf(d.kind(i)))
}

func (d *jsonDoc) decodeInt(i int, field string) (int, error) {
	if d.kind(i) != '0' {
		return 0, reqErr(field, "must be an integer, got %s", kindNameOf(d.kind(i)))
	}
	f, err := strconv.ParseFloat(bstr(d.raw(i)), 64)
	if err != nil || f != math.Trunc(f) || f > math.MaxInt32 || f < math.MinInt32 {
		return 0, reqErr(field, "must be an integer between %d and %d", math.MinInt32, math.MaxInt32)
	}
	return int(f), nil
}

func (d *jsonDoc) decodeArray(i int, field string) error {
	if d.kind(i) != '[' {
		return reqErr(field, "must be an array, got %s", kindNameOf(d.kind(i)))
	}
	return nil
}

func (d *jsonDoc) decodeObject(i int, field string) error {
	if d.kind(i) != '{' {
		return reqErr(field, "must be an object, got %s", kindNameOf(d.kind(i)))
	}
	return nil
}

// optString decodes member key of object obj when present and not null.
func (d *jsonDoc) optString(obj int, key, field string) (string, bool, error) {
	v := d.get(obj, key)
	if d.null(v) {
		return "", false, nil
	}
	s, err := d.decodeString(v, field+"."+key)
	return s, err == nil, err
}

// reqString decodes the required string member key of object obj.
func (d *jsonDoc) reqString(obj int, key, field string) (string, error) {
	v := d.get(obj, key)
	if d.null(v) {
		return "", reqErr(field+"."+key, "field required")
	}
	return d.decodeString(v, field+"."+key)
}

func indexField(field string, i int) string { return field + "[" + strconv.Itoa(i) + "]" }

func (d *jsonDoc) decodeSystem(sys int) ([]string, error) {
	if d.kind(sys) == '"' {
		return []string{d.str(sys)}, nil
	}
	if d.kind(sys) != '[' {
		return nil, reqErr("system", "must be a string or an array of text blocks, got %s", kindNameOf(d.kind(sys)))
	}
	out := make([]string, 0, d.count(sys))
	i := 0
	for it := d.nodes[sys].first; it >= 0; it, i = d.nodes[it].next, i+1 {
		if d.kind(it) == '"' {
			out = append(out, d.str(it))
			continue
		}
		field := indexField("system", i)
		if err := d.decodeObject(it, field); err != nil {
			return nil, err
		}
		typ, err := d.reqString(it, "type", field)
		if err != nil {
			return nil, err
		}
		if typ != "text" {
			return nil, reqErr(field+".type", "unsupported system block type %q; allowed: text", bounded(typ))
		}
		text, err := d.reqString(it, "text", field)
		if err != nil {
			return nil, err
		}
		out = append(out, text)
	}
	return out, nil
}

func (d *jsonDoc) decodeMessages(msgs int) ([]message, error) {
	if err := d.decodeArray(msgs, "messages"); err != nil {
		return nil, err
	}
	n := d.count(msgs)
	if n == 0 {
		return nil, reqErr("messages", "must contain at least one message")
	}
	out := make([]message, 0, n)
	i := 0
	for it := d.nodes[msgs].first; it >= 0; it, i = d.nodes[it].next, i+1 {
		field := indexField("messages", i)
		if err := d.decodeObject(it, field); err != nil {
			return nil, err
		}
		role, err := d.reqString(it, "role", field)
		if err != nil {
			return nil, err
		}
		switch role {
		case "user", "assistant", "system":
		default:
			return nil, reqErr(field+".role", "unsupported role %q; allowed: user, assistant, system", bounded(role))
		}
		c := d.get(it, "content")
		if d.null(c) {
			return nil, reqErr(field+".content", "field required")
		}
		content, err := d.decodeContent(c, field+".content", role)
		if err != nil {
			return nil, err
		}
		if d.kind(c) == '[' && len(content) == 0 && !(role == "assistant" && i == n-1) {
			return nil, reqErr(field+".content", "must contain at least one content block (only a final assistant message may be empty)")
		}
		out = append(out, message{role: role, content: content})
	}
	if err := checkToolResults(out); err != nil {
		return nil, err
	}
	return out, nil
}

// checkToolResults refuses a tool_result whose tool_use_id matches no
// tool_use of the nearest earlier assistant message, as the Anthropic API
// does: the upstream would get a function_call_output for a call it never
// made. A tool_result before any assistant message is accepted: a history
// cut short (compacted or truncated by the client) may begin in the middle
// of a tool loop, and there is nothing left to check it against.
func checkToolResults(msgs []message) error {
	prev := -1 // index of the nearest earlier assistant message
	for i, m := range msgs {
		if m.role == "assistant" {
			prev = i
			continue
		}
		if prev < 0 {
			continue
		}
		for j, b := range m.content {
			if b.typ != "tool_result" || hasToolUse(msgs[prev].content, b.toolUseID) {
				continue
			}
			return reqErr(indexField(indexField("messages", i)+".content", j)+".tool_use_id",
				"%q matches no tool_use block of the assistant message before it (messages[%d]); each tool_result must answer a tool_use of that message",
				bounded(b.toolUseID), prev)
		}
	}
	return nil
}

func hasToolUse(blocks []block, id string) bool {
	id = stripCallIDSuffix(id)
	for _, b := range blocks {
		if b.typ == "tool_use" && stripCallIDSuffix(b.id) == id {
			return true
		}
	}
	return false
}

// Where a content block sits decides which types it may have: what the
// upstream can carry there.
var blockTypes = map[string][]string{
	"user":        {"text", "image", "document", "search_result", "tool_result", "tool_reference"},
	"assistant":   {"text", "thinking", "redacted_thinking", "tool_use"},
	"system":      {"text"},
	"tool_result": {"text", "image", "document", "search_result", "tool_reference"},
	"document":    {"text", "image"}, // a document's content source
}

// decodeContent decodes a string or an array of content blocks found in
// place (a role, "tool_result" or "document"; see blockTypes).
func (d *jsonDoc) decodeContent(c int, field, place string) ([]block, error) {
	switch d.kind(c) {
	case '"':
		return []block{{typ: "text", text: d.str(c)}}, nil
	case '[':
	default:
		return nil, reqErr(field, "must be a string or an array of content blocks, got %s", kindNameOf(d.kind(c)))
	}
	out := make([]block, 0, d.count(c))
	i := 0
	for it := d.nodes[c].first; it >= 0; it, i = d.nodes[it].next, i+1 {
		b, err := d.decodeBlock(it, indexField(field, i), place)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func (d *jsonDoc) decodeBlock(m int, field, place string) (block, error) {
	if err := d.decodeObject(m, field); err != nil {
		return block{}, err
	}
	typ, err := d.reqString(m, "type", field)
	if err != nil {
		return block{}, err
	}
	if allowed := blockTypes[place]; !slices.Contains(allowed, typ) {
		return block{}, reqErr(field+".type", "content block type %q cannot be sent to the OpenAI backend in %s; allowed there: %s",
			bounded(typ), placeName(place), strings.Join(allowed, ", "))
	}
	b := block{typ: typ, raw: d.raw(m), spaced: d.nodes[m].flags&flagSpace != 0}
	switch typ {
	case "text":
		if b.text, err = d.reqString(m, "text", field); err != nil {
			return block{}, err
		}
	case "image":
		if err := d.decodeImageSource(m, field, &b); err != nil {
			return block{}, err
		}
	case "tool_use":
		if b.id, err = d.reqString(m, "id", field); err != nil {
			return block{}, err
		}
		if b.name, err = d.reqString(m, "name", field); err != nil {
			return block{}, err
		}
		in := d.get(m, "input")
		switch {
		case d.null(in):
			b.args = "{}"
		case d.kind(in) != '{':
			return block{}, reqErr(field+".input", "must be an object, got %s", kindNameOf(d.kind(in)))
		default:
			d.scratchOut = d.appendCanonical(d.scratchOut[:0], in)
			b.args = string(d.scratchOut)
		}
	case "tool_result":
		if b.toolUseID, err = d.reqString(m, "tool_use_id", field); err != nil {
			return block{}, err
		}
		if c := d.get(m, "content"); !d.null(c) {
			switch d.kind(c) {
			case '"':
				b.contentString = d.str(c)
				b.contentIsStr = true
			case '[':
				if b.content, err = d.decodeContent(c, field+".content", "tool_result"); err != nil {
					return block{}, err
				}
			default:
				return block{}, reqErr(field+".content", "must be a string or an array of content blocks, got %s", kindNameOf(d.kind(c)))
			}
		} else {
			b.contentIsStr = true // no content: an empty output
		}
		if e := d.get(m, "is_error"); !d.null(e) {
			if _, err := d.decodeBool(e, field+".is_error"); err != nil {
				return block{}, err
			}
		}
	case "thinking":
		if b.thinking, err = d.reqString(m, "thinking", field); err != nil {
			return block{}, err
		}
		if b.signature, _, err = d.optString(m, "signature", field); err != nil {
			return block{}, err
		}
	case "tool_reference":
		if b.toolName, err = d.reqString(m, "tool_name", field); err != nil {
			return block{}, err
		}
	case "document":
		if err := d.decodeDocument(m, field, &b); err != nil {
			return block{}, err
		}
	case "search_result":
		if err := d.decodeSearchResult(m, field, &b); err != nil {
			return block{}, err
		}
	}
	return b, nil
}

func (d *jsonDoc) decodeTools(tools int) ([]tool, error) {
	if err := d.decodeArray(tools, "tools"); err != nil {
		return nil, err
	}
	out := make([]tool, 0, d.count(tools))
	i := 0
	for m := d.nodes[tools].first; m >= 0; m, i = d.nodes[m].next, i+1 {
		field := indexField("tools", i)
		if err := d.decodeObject(m, field); err != nil {
			return nil, err
		}
		var t tool
		var err error
		if t.name, err = d.reqString(m, "name", field); err != nil {
			return nil, err
		}
		typ, _, err := d.optString(m, "type", field)
		if err != nil {
			return nil, err
		}
		if t.description, _, err = d.optString(m, "description", field); err != nil {
			return nil, err
		}
		if dl := d.get(m, "defer_loading"); !d.null(dl) {
			if t.deferred, err = d.decodeBool(dl, field+".defer_loading"); err != nil {
				return nil, err
			}
		}
		schema := d.get(m, "input_schema")
		switch {
		case d.null(schema) && (typ == "" || typ == "custom"):
			return nil, reqErr(field+".input_schema", "field required for custom tools")
		case d.null(schema):
			t.server = true
		case d.kind(schema) != '{':
			return nil, reqErr(field+".input_schema", "must be an object, got %s", kindNameOf(d.kind(schema)))
		default:
			t.schema = d.compact(schema)
			t.required = d.requiredList(schema)
		}
		out = append(out, t)
	}
	return out, nil
}

// requiredList is what decoding the schema into
// struct{ Required []string `json:"required"` } yields, nil on a decoding
// error.
func (d *jsonDoc) requiredList(schema int) []string {
	found, n := -1, 0
	for c := d.nodes[schema].first; c >= 0; c = d.nodes[c].next {
		if bytes.EqualFold(d.key(c), []byte("required")) {
			found = c
			n++
		}
	}
	switch {
	case n == 0 || d.kind(found) == 'n':
		return nil
	case n > 1:
		// Duplicates: rare; let encoding/json apply its merge rules.
		var s struct {
			Required []string `json:"required"`
		}
		if json.Unmarshal(d.raw(schema), &s) == nil {
			return s.Required
		}
		return nil
	case d.kind(found) != '[':
		return nil
	}
	out := make([]string, 0, d.count(found))
	for e := d.nodes[found].first; e >= 0; e = d.nodes[e].next {
		switch d.kind(e) {
		case '"':
			out = append(out, d.str(e))
		case 'n':
			out = append(out, "")
		default:
			return nil
		}
	}
	return out
}

func (d *jsonDoc) decodeToolChoice(m int) (*toolChoice, error) {
	if err := d.decodeObject(m, "tool_choice"); err != nil {
		return nil, err
	}
	tc := &toolChoice{}
	var err error
	if tc.typ, err = d.reqString(m, "type", "tool_choice"); err != nil {
		return nil, err
	}
	switch tc.typ {
	case "auto", "any", "none":
	case "tool":
		if tc.name, err = d.reqString(m, "name", "tool_choice"); err != nil {
			return nil, err
		}
	default:
		return nil, reqErr("tool_choice.type", "unsupported value %q; allowed: auto, any, tool, none", bounded(tc.typ))
	}
	if dp := d.get(m, "disable_parallel_tool_use"); !d.null(dp) {
		if tc.disableParallelToolUse, err = d.decodeBool(dp, "tool_choice.disable_parallel_tool_use"); err != nil {
			return nil, err
		}
	}
	return tc, nil
}
