package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

var errTrailingData = errors.New("unexpected data after the JSON value")

// MessagesRequest is a decoded and validated Anthropic Messages request
// body. Fields the translation does not use are not kept; tool schemas and
// tool_result blocks keep their raw JSON so they can be forwarded verbatim.
type MessagesRequest struct {
	body []byte // the body as received (for the spec 8.4 token estimate)

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
	hasDiagnostics bool
}

type message struct {
	role    string // user, assistant or system
	content []block
}

// block is one content block. Only the fields of its type are set.
type block struct {
	typ string
	raw json.RawMessage // the block object as sent

	text string // text

	// image
	sourceType, mediaType, data, url string

	// tool_use
	id, name string
	input    json.RawMessage

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
	schema      json.RawMessage // compact input_schema
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

// MaxTokens is the client's max_tokens (not sent upstream; spec 2.6).
func (r *MessagesRequest) MaxTokens() int { return r.maxTokens }

type wireRequest struct {
	Model        json.RawMessage `json:"model"`
	Messages     json.RawMessage `json:"messages"`
	MaxTokens    json.RawMessage `json:"max_tokens"`
	System       json.RawMessage `json:"system"`
	Stream       json.RawMessage `json:"stream"`
	Tools        json.RawMessage `json:"tools"`
	ToolChoice   json.RawMessage `json:"tool_choice"`
	Metadata     json.RawMessage `json:"metadata"`
	Thinking     json.RawMessage `json:"thinking"`
	OutputConfig json.RawMessage `json:"output_config"`
	Temperature  json.RawMessage `json:"temperature"`
	Diagnostics  json.RawMessage `json:"diagnostics"`
}

func reqErr(field, format string, args ...any) *RequestError {
	return &RequestError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// DecodeRequest decodes and validates an Anthropic Messages request body.
// model, messages and max_tokens are required. The request keeps a
// reference to body (for the token estimate): do not modify it afterwards. Bad input of any kind yields
// a *RequestError naming the offending field; it never panics.
func DecodeRequest(body []byte) (*MessagesRequest, error) {
	if jsonKind(body) != '{' {
		if !json.Valid(body) {
			return nil, reqErr("", "Invalid JSON body: the request body must be a JSON object")
		}
		return nil, reqErr("", "the request body must be a JSON object")
	}
	if !json.Valid(body) {
		return nil, reqErr("", "Invalid JSON body: the request body is not valid JSON")
	}
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, reqErr("", "Invalid JSON body: the request body is not valid JSON")
	}
	r := &MessagesRequest{body: body}
	var err error
	if isNull(w.Model) {
		return nil, reqErr("model", "field required")
	}
	if r.model, err = decodeString(w.Model, "model"); err != nil {
		return nil, err
	}
	if r.model == "" {
		return nil, reqErr("model", "must be a non-empty string")
	}
	if isNull(w.MaxTokens) {
		return nil, reqErr("max_tokens", "field required")
	}
	if r.maxTokens, err = decodeInt(w.MaxTokens, "max_tokens"); err != nil {
		return nil, err
	}
	if r.maxTokens < 1 {
		return nil, reqErr("max_tokens", "must be an integer of at least 1")
	}
	if isNull(w.Messages) {
		return nil, reqErr("messages", "field required")
	}
	if r.messages, err = decodeMessages(w.Messages); err != nil {
		return nil, err
	}
	if err := r.decodeOptional(&w); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *MessagesRequest) decodeOptional(w *wireRequest) error {
	var err error
	if !isNull(w.Stream) {
		if r.stream, err = decodeBool(w.Stream, "stream"); err != nil {
			return err
		}
	}
	if !isNull(w.System) {
		if r.system, err = decodeSystem(w.System); err != nil {
			return err
		}
	}
	if !isNull(w.Tools) {
		if r.tools, err = decodeTools(w.Tools); err != nil {
			return err
		}
	}
	if !isNull(w.ToolChoice) {
		if r.toolChoice, err = decodeToolChoice(w.ToolChoice); err != nil {
			return err
		}
	}
	if !isNull(w.Metadata) {
		var m struct {
			UserID json.RawMessage `json:"user_id"`
		}
		if jsonKind(w.Metadata) != '{' {
			return reqErr("metadata", "must be an object")
		}
		if err := json.Unmarshal(w.Metadata, &m); err != nil {
			return reqErr("metadata", "must be an object")
		}
		if !isNull(m.UserID) {
			if r.metadataUserID, err = decodeString(m.UserID, "metadata.user_id"); err != nil {
				return err
			}
		}
	}
	if !isNull(w.Thinking) {
		var t struct {
			Type   json.RawMessage `json:"type"`
			Budget json.RawMessage `json:"budget_tokens"`
		}
		if jsonKind(w.Thinking) != '{' || json.Unmarshal(w.Thinking, &t) != nil {
			return reqErr("thinking", "must be an object")
		}
		if isNull(t.Type) {
			return reqErr("thinking.type", "field required; allowed: enabled, disabled, adaptive")
		}
		if r.thinkingType, err = decodeString(t.Type, "thinking.type"); err != nil {
			return err
		}
		if !isNull(t.Budget) {
			if r.thinkingBudget, err = decodeInt(t.Budget, "thinking.budget_tokens"); err != nil {
				return err
			}
		}
		if r.thinkingType == "enabled" && isNull(t.Budget) {
			return reqErr("thinking.budget_tokens", "field required when thinking.type is enabled")
		}
	}
	if !isNull(w.OutputConfig) {
		var oc struct {
			Effort json.RawMessage `json:"effort"`
		}
		if jsonKind(w.OutputConfig) != '{' || json.Unmarshal(w.OutputConfig, &oc) != nil {
			return reqErr("output_config", "must be an object")
		}
		if !isNull(oc.Effort) {
			e, err := decodeString(oc.Effort, "output_config.effort")
			if err != nil {
				return err
			}
			r.effort = trimSpace(e)
		}
	}
	if !isNull(w.Temperature) {
		if k := jsonKind(w.Temperature); k != '-' && (k < '0' || k > '9') {
			return reqErr("temperature", "must be a number")
		}
	}
	r.hasDiagnostics = !isNull(w.Diagnostics)
	return nil
}

func trimSpace(s string) string { return string(bytes.TrimSpace([]byte(s))) }

func kindName(raw json.RawMessage) string {
	switch jsonKind(raw) {
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

func decodeString(raw json.RawMessage, field string) (string, error) {
	if jsonKind(raw) != '"' {
		return "", reqErr(field, "must be a string, got %s", kindName(raw))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", reqErr(field, "must be a string")
	}
	return s, nil
}

func decodeBool(raw json.RawMessage, field string) (bool, error) {
	switch jsonKind(raw) {
	case 't', 'f':
		var b bool
		if err := json.Unmarshal(raw, &b); err == nil {
			return b, nil
		}
	}
	return false, reqErr(field, "must be a boolean, got %s", kindName(raw))
}

func decodeInt(raw json.RawMessage, field string) (int, error) {
	k := jsonKind(raw)
	if k != '-' && (k < '0' || k > '9') {
		return 0, reqErr(field, "must be an integer, got %s", kindName(raw))
	}
	f, err := strconv.ParseFloat(string(bytes.TrimSpace(raw)), 64)
	if err != nil || f != math.Trunc(f) || f > math.MaxInt32 || f < math.MinInt32 {
		return 0, reqErr(field, "must be an integer between %d and %d", math.MinInt32, math.MaxInt32)
	}
	return int(f), nil
}

func decodeArray(raw json.RawMessage, field string) ([]json.RawMessage, error) {
	if jsonKind(raw) != '[' {
		return nil, reqErr(field, "must be an array, got %s", kindName(raw))
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, reqErr(field, "must be an array")
	}
	return items, nil
}

func decodeObject(raw json.RawMessage, field string) (map[string]json.RawMessage, error) {
	if jsonKind(raw) != '{' {
		return nil, reqErr(field, "must be an object, got %s", kindName(raw))
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, reqErr(field, "must be an object")
	}
	return m, nil
}

// optString decodes m[key] when present and not null.
func optString(m map[string]json.RawMessage, key, field string) (string, bool, error) {
	raw, ok := m[key]
	if !ok || isNull(raw) {
		return "", false, nil
	}
	s, err := decodeString(raw, field+"."+key)
	return s, err == nil, err
}

// reqString decodes the required string m[key].
func reqString(m map[string]json.RawMessage, key, field string) (string, error) {
	raw, ok := m[key]
	if !ok || isNull(raw) {
		return "", reqErr(field+"."+key, "field required")
	}
	return decodeString(raw, field+"."+key)
}

func decodeSystem(raw json.RawMessage) ([]string, error) {
	if jsonKind(raw) == '"' {
		s, err := decodeString(raw, "system")
		if err != nil {
			return nil, err
		}
		return []string{s}, nil
	}
	items, err := decodeArray(raw, "system")
	if err != nil {
		return nil, reqErr("system", "must be a string or an array of text blocks, got %s", kindName(raw))
	}
	out := make([]string, 0, len(items))
	for i, it := range items {
		field := "system[" + strconv.Itoa(i) + "]"
		if jsonKind(it) == '"' {
			s, err := decodeString(it, field)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
			continue
		}
		m, err := decodeObject(it, field)
		if err != nil {
			return nil, err
		}
		typ, err := reqString(m, "type", field)
		if err != nil {
			return nil, err
		}
		if typ != "text" {
			return nil, reqErr(field+".type", "unsupported system block type %q; allowed: text", bounded(typ))
		}
		text, err := reqString(m, "text", field)
		if err != nil {
			return nil, err
		}
		out = append(out, text)
	}
	return out, nil
}

func decodeMessages(raw json.RawMessage) ([]message, error) {
	items, err := decodeArray(raw, "messages")
	if err != nil {
		return nil, err
	}
	out := make([]message, 0, len(items))
	for i, it := range items {
		field := "messages[" + strconv.Itoa(i) + "]"
		m, err := decodeObject(it, field)
		if err != nil {
			return nil, err
		}
		role, err := reqString(m, "role", field)
		if err != nil {
			return nil, err
		}
		switch role {
		case "user", "assistant", "system":
		default:
			return nil, reqErr(field+".role", "unsupported role %q; allowed: user, assistant, system", bounded(role))
		}
		craw, ok := m["content"]
		if !ok || isNull(craw) {
			return nil, reqErr(field+".content", "field required")
		}
		content, err := decodeContent(craw, field+".content")
		if err != nil {
			return nil, err
		}
		out = append(out, message{role: role, content: content})
	}
	return out, nil
}

// decodeContent decodes a string or an array of content blocks.
func decodeContent(raw json.RawMessage, field string) ([]block, error) {
	if jsonKind(raw) == '"' {
		s, err := decodeString(raw, field)
		if err != nil {
			return nil, err
		}
		return []block{{typ: "text", text: s}}, nil
	}
	if jsonKind(raw) != '[' {
		return nil, reqErr(field, "must be a string or an array of content blocks, got %s", kindName(raw))
	}
	items, err := decodeArray(raw, field)
	if err != nil {
		return nil, err
	}
	out := make([]block, 0, len(items))
	for i, it := range items {
		b, err := decodeBlock(it, field+"["+strconv.Itoa(i)+"]")
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func decodeBlock(raw json.RawMessage, field string) (block, error) {
	m, err := decodeObject(raw, field)
	if err != nil {
		return block{}, err
	}
	typ, err := reqString(m, "type", field)
	if err != nil {
		return block{}, err
	}
	b := block{typ: typ, raw: raw}
	switch typ {
	case "text":
		if b.text, err = reqString(m, "text", field); err != nil {
			return block{}, err
		}
	case "image":
		if err := decodeImageSource(m, field, &b); err != nil {
			return block{}, err
		}
	case "tool_use":
		if b.id, err = reqString(m, "id", field); err != nil {
			return block{}, err
		}
		if b.name, err = reqString(m, "name", field); err != nil {
			return block{}, err
		}
		in, ok := m["input"]
		switch {
		case !ok || isNull(in):
			b.input = json.RawMessage("{}")
		case jsonKind(in) != '{':
			return block{}, reqErr(field+".input", "must be an object, got %s", kindName(in))
		default:
			b.input = in
		}
	case "tool_result":
		if b.toolUseID, err = reqString(m, "tool_use_id", field); err != nil {
			return block{}, err
		}
		if c, ok := m["content"]; ok && !isNull(c) {
			if jsonKind(c) == '"' {
				if b.contentString, err = decodeString(c, field+".content"); err != nil {
					return block{}, err
				}
				b.contentIsStr = true
			} else {
				if jsonKind(c) != '[' {
					return block{}, reqErr(field+".content", "must be a string or an array of content blocks, got %s", kindName(c))
				}
				if b.content, err = decodeContent(c, field+".content"); err != nil {
					return block{}, err
				}
			}
		} else {
			b.contentIsStr = true // no content: an empty output
		}
		if e, ok := m["is_error"]; ok && !isNull(e) {
			if _, err := decodeBool(e, field+".is_error"); err != nil {
				return block{}, err
			}
		}
	case "thinking":
		if b.thinking, err = reqString(m, "thinking", field); err != nil {
			return block{}, err
		}
		if b.signature, _, err = optString(m, "signature", field); err != nil {
			return block{}, err
		}
	case "tool_reference":
		if b.toolName, err = reqString(m, "tool_name", field); err != nil {
			return block{}, err
		}
	}
	return b, nil
}

func decodeImageSource(m map[string]json.RawMessage, field string, b *block) error {
	sraw, ok := m["source"]
	if !ok || isNull(sraw) {
		return reqErr(field+".source", "field required")
	}
	f := field + ".source"
	s, err := decodeObject(sraw, f)
	if err != nil {
		return err
	}
	if b.sourceType, err = reqString(s, "type", f); err != nil {
		return err
	}
	switch b.sourceType {
	case "base64":
		if b.mediaType, err = reqString(s, "media_type", f); err != nil {
			return err
		}
		if b.data, err = reqString(s, "data", f); err != nil {
			return err
		}
	case "url":
		if b.url, err = reqString(s, "url", f); err != nil {
			return err
		}
	default:
		// Other sources (file ids, …) have no upstream equivalent; the image
		// is dropped during translation (spec 2.3).
	}
	return nil
}

func decodeTools(raw json.RawMessage) ([]tool, error) {
	items, err := decodeArray(raw, "tools")
	if err != nil {
		return nil, err
	}
	out := make([]tool, 0, len(items))
	for i, it := range items {
		field := "tools[" + strconv.Itoa(i) + "]"
		m, err := decodeObject(it, field)
		if err != nil {
			return nil, err
		}
		var t tool
		if t.name, err = reqString(m, "name", field); err != nil {
			return nil, err
		}
		typ, _, err := optString(m, "type", field)
		if err != nil {
			return nil, err
		}
		if t.description, _, err = optString(m, "description", field); err != nil {
			return nil, err
		}
		if d, ok := m["defer_loading"]; ok && !isNull(d) {
			if t.deferred, err = decodeBool(d, field+".defer_loading"); err != nil {
				return nil, err
			}
		}
		schema, ok := m["input_schema"]
		switch {
		case (!ok || isNull(schema)) && (typ == "" || typ == "custom"):
			return nil, reqErr(field+".input_schema", "field required for custom tools")
		case !ok || isNull(schema):
			t.server = true
		case jsonKind(schema) != '{':
			return nil, reqErr(field+".input_schema", "must be an object, got %s", kindName(schema))
		default:
			t.schema = compactJSON(schema)
			var s struct {
				Required []string `json:"required"`
			}
			if json.Unmarshal(schema, &s) == nil {
				t.required = s.Required
			}
		}
		out = append(out, t)
	}
	return out, nil
}

func decodeToolChoice(raw json.RawMessage) (*toolChoice, error) {
	m, err := decodeObject(raw, "tool_choice")
	if err != nil {
		return nil, err
	}
	tc := &toolChoice{}
	if tc.typ, err = reqString(m, "type", "tool_choice"); err != nil {
		return nil, err
	}
	switch tc.typ {
	case "auto", "any", "none":
	case "tool":
		if tc.name, err = reqString(m, "name", "tool_choice"); err != nil {
			return nil, err
		}
	default:
		return nil, reqErr("tool_choice.type", "unsupported value %q; allowed: auto, any, tool, none", bounded(tc.typ))
	}
	if d, ok := m["disable_parallel_tool_use"]; ok && !isNull(d) {
		if tc.disableParallelToolUse, err = decodeBool(d, "tool_choice.disable_parallel_tool_use"); err != nil {
			return nil, err
		}
	}
	return tc, nil
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
