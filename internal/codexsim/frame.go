package codexsim

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// wireError is an in-band error the emulator answers with an `error` frame.
type wireError struct {
	Status  int    // 0 = no status field
	Type    string // error.type
	Code    string // error.code
	Message string
	Param   string // "" = no param field
	Extra   obj    // more fields of the error object (usage limits: plan_type, resets_in_seconds, resets_at)
}

func (e *wireError) Error() string { return e.Code + ": " + e.Message }

// frame renders e as an `error` frame:
// {"type":"error","status":S,"error":{"type","code","message","param"}}.
func (e *wireError) frame() obj {
	typ := e.Type
	if typ == "" {
		typ = "invalid_request_error"
	}
	var param any
	if e.Param != "" {
		param = e.Param
	}
	f := obj{{"type", "error"}}
	if e.Status != 0 {
		f = append(f, field{"status", e.Status})
	}
	eo := obj{{"type", typ}, {"code", e.Code}, {"message", e.Message}, {"param", param}}
	return append(f, field{"error", append(eo, e.Extra...)})
}

func invalidRequest(code, param, format string, args ...any) *wireError {
	if code == "" {
		code = "invalid_request_error"
	}
	return &wireError{Status: 400, Type: "invalid_request_error", Code: code, Message: fmt.Sprintf(format, args...), Param: param}
}

// createRequest is a decoded response.create frame. Every field Codex CLI
// 0.171.0 and clodex send is read; fields the emulator does not interpret
// are type-checked and otherwise ignored.
type createRequest struct {
	Model              string
	Input              []json.RawMessage
	Instructions       string
	Tools              json.RawMessage // raw array, nil when absent
	Generate           bool            // false only for an explicit "generate": false
	PreviousResponseID string
	Include            []string
	// Format is the schema of a json_schema text.format: the answer is a
	// JSON instance of it (structured.go). Nil when absent.
	Format json.RawMessage
}

// rawCreate mirrors the frame's JSON with every field left raw, so each one
// can be type-checked and named in an error.
type rawCreate struct {
	Type               json.RawMessage `json:"type"`
	Model              json.RawMessage `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       json.RawMessage `json:"instructions"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ParallelToolCalls  json.RawMessage `json:"parallel_tool_calls"`
	Reasoning          json.RawMessage `json:"reasoning"`
	Store              json.RawMessage `json:"store"`
	Stream             json.RawMessage `json:"stream"`
	Include            json.RawMessage `json:"include"`
	PromptCacheKey     json.RawMessage `json:"prompt_cache_key"`
	Text               json.RawMessage `json:"text"`
	Generate           json.RawMessage `json:"generate"`
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	ClientMetadata     json.RawMessage `json:"client_metadata"`
	ServiceTier        json.RawMessage `json:"service_tier"`
	Temperature        json.RawMessage `json:"temperature"`
	Metadata           json.RawMessage `json:"metadata"`
	Response           json.RawMessage `json:"response"`
}

func isNull(r json.RawMessage) bool { return len(r) == 0 || string(r) == "null" }

// jsonKind names the JSON kind of a raw value for error messages.
func jsonKind(r json.RawMessage) string {
	r = bytes.TrimSpace(r)
	if len(r) == 0 {
		return "nothing"
	}
	switch r[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// decodeFrame parses one client frame. It returns a wireError (never a Go
// error of another kind) for every frame the emulator does not accept; the
// error names the field and what is allowed.
func decodeFrame(data []byte) (*createRequest, *wireError) {
	if !utf8.Valid(data) {
		return nil, invalidRequest("invalid_json", "", "frame is not valid UTF-8; send one JSON object per text frame")
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		if !json.Valid(trimmed) {
			return nil, invalidRequest("invalid_json", "", "frame is not valid JSON; send one JSON object per text frame")
		}
		return nil, invalidRequest("invalid_json", "", "frame is %s; want a JSON object with \"type\": \"response.create\"", jsonKind(trimmed))
	}
	var raw rawCreate
	if err := json.Unmarshal(trimmed, &raw); err != nil {
		if !json.Valid(trimmed) {
			return nil, invalidRequest("invalid_json", "", "frame is not valid JSON; send one JSON object per text frame")
		}
		return nil, invalidRequest("invalid_json", "", "frame could not be decoded: %s", sanitizeErr(err))
	}
	var typ string
	if isNull(raw.Type) {
		return nil, invalidRequest("", "type", "missing required parameter 'type'; want \"response.create\"")
	}
	if err := json.Unmarshal(raw.Type, &typ); err != nil {
		return nil, invalidRequest("", "type", "'type' is %s; want the string \"response.create\"", jsonKind(raw.Type))
	}
	if typ != "response.create" {
		return nil, invalidRequest("unsupported_event_type", "type", "unsupported frame type %q; the only client frame is \"response.create\"", clip(typ, 64))
	}
	// Some clients nest the body under "response"; the real backend reads
	// top-level fields, so a nested body is an error that says so.
	if !isNull(raw.Response) {
		return nil, invalidRequest("unknown_parameter", "response", "unknown parameter 'response'; put the request fields at the top level of the response.create frame")
	}

	req := &createRequest{Generate: true}
	str := func(name string, r json.RawMessage, dst *string) *wireError {
		if isNull(r) {
			return nil
		}
		if err := json.Unmarshal(r, dst); err != nil {
			return invalidRequest("invalid_type", name, "'%s' is %s; want a string", name, jsonKind(r))
		}
		return nil
	}
	boolean := func(name string, r json.RawMessage) (*bool, *wireError) {
		if isNull(r) {
			return nil, nil
		}
		var b bool
		if err := json.Unmarshal(r, &b); err != nil {
			return nil, invalidRequest("invalid_type", name, "'%s' is %s; want a boolean", name, jsonKind(r))
		}
		return &b, nil
	}
	kind := func(name string, r json.RawMessage, want byte, wantName string) *wireError {
		if isNull(r) {
			return nil
		}
		if bytes.TrimSpace(r)[0] != want {
			return invalidRequest("invalid_type", name, "'%s' is %s; want %s", name, jsonKind(r), wantName)
		}
		return nil
	}

	if isNull(raw.Model) {
		return nil, invalidRequest("", "model", "missing required parameter 'model'; want a non-empty model id string")
	}
	if e := str("model", raw.Model, &req.Model); e != nil {
		return nil, e
	}
	if strings.TrimSpace(req.Model) == "" {
		return nil, invalidRequest("", "model", "'model' is empty; want a non-empty model id string")
	}
	if isNull(raw.Input) {
		return nil, invalidRequest("", "input", "missing required parameter 'input'; want an array of input items")
	}
	if e := kind("input", raw.Input, '[', "an array of input items"); e != nil {
		return nil, e
	}
	if err := json.Unmarshal(raw.Input, &req.Input); err != nil {
		return nil, invalidRequest("invalid_type", "input", "'input' could not be decoded: %s", sanitizeErr(err))
	}
	for i, it := range req.Input {
		if isNull(it) || bytes.TrimSpace(it)[0] != '{' {
			return nil, invalidRequest("invalid_type", fmt.Sprintf("input[%d]", i), "'input[%d]' is %s; want an input item object", i, jsonKind(it))
		}
		if e := checkMessageContent(i, it); e != nil {
			return nil, e
		}
	}
	if e := str("instructions", raw.Instructions, &req.Instructions); e != nil {
		return nil, e
	}
	if e := kind("tools", raw.Tools, '[', "an array of tool objects"); e != nil {
		return nil, e
	}
	if !isNull(raw.Tools) {
		var tools []json.RawMessage
		if err := json.Unmarshal(raw.Tools, &tools); err != nil {
			return nil, invalidRequest("invalid_type", "tools", "'tools' could not be decoded: %s", sanitizeErr(err))
		}
		for i, t := range tools {
			if isNull(t) || bytes.TrimSpace(t)[0] != '{' {
				return nil, invalidRequest("invalid_type", fmt.Sprintf("tools[%d]", i), "'tools[%d]' is %s; want a tool object", i, jsonKind(t))
			}
		}
		req.Tools = raw.Tools
	}
	if !isNull(raw.ToolChoice) {
		c := bytes.TrimSpace(raw.ToolChoice)[0]
		if c != '"' && c != '{' {
			return nil, invalidRequest("invalid_type", "tool_choice", "'tool_choice' is %s; want \"auto\", \"required\", \"none\" or a {\"type\":\"function\",\"name\":...} object", jsonKind(raw.ToolChoice))
		}
		if c == '"' {
			var s string
			_ = json.Unmarshal(raw.ToolChoice, &s)
			switch s {
			case "auto", "required", "none":
			default:
				return nil, invalidRequest("invalid_value", "tool_choice", "'tool_choice' %q is invalid; want \"auto\", \"required\", \"none\" or a function object", clip(s, 64))
			}
		}
	}
	if _, e := boolean("parallel_tool_calls", raw.ParallelToolCalls); e != nil {
		return nil, e
	}
	if e := kind("reasoning", raw.Reasoning, '{', "an object such as {\"effort\":\"medium\"}"); e != nil {
		return nil, e
	}
	store, e := boolean("store", raw.Store)
	if e != nil {
		return nil, e
	}
	if store != nil && *store {
		return nil, invalidRequest("invalid_value", "store", "'store' must be false: this backend does not store responses")
	}
	if _, e := boolean("stream", raw.Stream); e != nil {
		return nil, e
	}
	if !isNull(raw.Include) {
		if err := json.Unmarshal(raw.Include, &req.Include); err != nil {
			return nil, invalidRequest("invalid_type", "include", "'include' is %s; want an array of strings such as [\"reasoning.encrypted_content\"]", jsonKind(raw.Include))
		}
	}
	var s string
	if e := str("prompt_cache_key", raw.PromptCacheKey, &s); e != nil {
		return nil, e
	}
	if e := str("service_tier", raw.ServiceTier, &s); e != nil {
		return nil, e
	}
	if e := kind("text", raw.Text, '{', "an object such as {\"verbosity\":\"low\"}"); e != nil {
		return nil, e
	}
	if req.Format, e = textFormat(raw.Text); e != nil {
		return nil, e
	}
	if e := kind("client_metadata", raw.ClientMetadata, '{', "an object"); e != nil {
		return nil, e
	}
	if e := kind("metadata", raw.Metadata, '{', "an object"); e != nil {
		return nil, e
	}
	if !isNull(raw.Temperature) {
		var f float64
		if err := json.Unmarshal(raw.Temperature, &f); err != nil {
			return nil, invalidRequest("invalid_type", "temperature", "'temperature' is %s that cannot be read; want a number such as 0.7", jsonKind(raw.Temperature))
		}
	}
	gen, e := boolean("generate", raw.Generate)
	if e != nil {
		return nil, e
	}
	if gen != nil {
		req.Generate = *gen
	}
	if e := str("previous_response_id", raw.PreviousResponseID, &req.PreviousResponseID); e != nil {
		return nil, e
	}
	if !isNull(raw.PreviousResponseID) && req.PreviousResponseID == "" {
		return nil, invalidRequest("", "previous_response_id", "'previous_response_id' is empty; omit it or give a response id")
	}
	return req, nil
}

// contentPart is one part of a message's content array.
type contentPart struct {
	Type     string          `json:"type"`
	Text     json.RawMessage `json:"text"`
	ImageURL *string         `json:"image_url"`
	FileID   *string         `json:"file_id"`
	FileData *string         `json:"file_data"`
	FileURL  *string         `json:"file_url"`
	Filename *string         `json:"filename"`
}

// The content part types of user, system and developer messages, and of
// assistant messages.
var (
	inputParts  = []string{"input_text", "input_image", "input_file"}
	outputParts = []string{"output_text", "refusal"}
)

// imageMediaTypes are the image types the backend reads.
var imageMediaTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// checkMessageContent checks the content parts of a message item (one with
// a role and a content array), as the backend does: a user, system or
// developer message carries input_text, input_image and input_file parts,
// an assistant message output_text and refusal parts. An input_image needs
// exactly one of image_url (a data: URL of a PNG, JPEG, GIF or WebP image,
// or an http(s) URL) and file_id; an input_file exactly one of file_data (a
// base64 data: URL, with a filename), file_url (http(s)) and file_id.
func checkMessageContent(i int, item json.RawMessage) *wireError {
	var m struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(item, &m) != nil || m.Role == "" || isNull(m.Content) || bytes.TrimSpace(m.Content)[0] != '[' {
		return nil
	}
	var parts []json.RawMessage
	if json.Unmarshal(m.Content, &parts) != nil {
		return invalidRequest("invalid_type", fmt.Sprintf("input[%d].content", i), "'input[%d].content' could not be decoded; want a string or an array of content parts", i)
	}
	for j, raw := range parts {
		param := fmt.Sprintf("input[%d].content[%d]", i, j)
		var p contentPart
		if json.Unmarshal(raw, &p) != nil {
			return invalidRequest("invalid_type", param, "'%s' is %s with fields of the wrong type; want a content part object", param, jsonKind(raw))
		}
		allowed := inputParts
		if m.Role == "assistant" {
			allowed = outputParts
		}
		if !slicesContains(allowed, p.Type) {
			return invalidRequest("invalid_value", param+".type", "content part type %q is not allowed in a %s message; allowed: %s", clip(p.Type, 64), clip(m.Role, 32), strings.Join(allowed, ", "))
		}
		switch p.Type {
		case "input_text", "output_text":
			var text string
			if json.Unmarshal(p.Text, &text) != nil {
				return invalidRequest("invalid_type", param+".text", "'%s.text' is %s; want a string", param, jsonKind(p.Text))
			}
		case "input_image":
			if e := checkImagePart(param, p); e != nil {
				return e
			}
		case "input_file":
			if e := checkFilePart(param, p); e != nil {
				return e
			}
		}
	}
	return nil
}

func countSet(ps ...*string) int {
	n := 0
	for _, p := range ps {
		if p != nil {
			n++
		}
	}
	return n
}

func checkImagePart(param string, p contentPart) *wireError {
	if countSet(p.ImageURL, p.FileID) != 1 {
		return invalidRequest("invalid_value", param, "an input_image needs exactly one of image_url and file_id")
	}
	if p.ImageURL == nil {
		return nil
	}
	u := *p.ImageURL
	if strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") {
		return nil
	}
	mediaType, data, ok := parseDataURL(u)
	switch {
	case !ok:
		return invalidRequest("invalid_image_url", param+".image_url", "image_url must be an http(s) URL or a base64 data: URL")
	case !slicesContains(imageMediaTypes, mediaType):
		return invalidRequest("unsupported_image_media_type", param+".image_url", "image media type %q is not supported; allowed: %s", clip(mediaType, 64), strings.Join(imageMediaTypes, ", "))
	case data == "":
		return invalidRequest("empty_image_file", param+".image_url", "the image data is empty")
	}
	if _, err := base64.StdEncoding.DecodeString(data); err != nil {
		return invalidRequest("invalid_base64_image", param+".image_url", "the image data is not valid base64")
	}
	return nil
}

func checkFilePart(param string, p contentPart) *wireError {
	if countSet(p.FileData, p.FileURL, p.FileID) != 1 {
		return invalidRequest("invalid_value", param, "an input_file needs exactly one of file_data, file_url and file_id")
	}
	switch {
	case p.FileURL != nil:
		if u := *p.FileURL; !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return invalidRequest("invalid_value", param+".file_url", "file_url must be an http(s) URL")
		}
	case p.FileData != nil:
		if p.Filename == nil || strings.TrimSpace(*p.Filename) == "" {
			return invalidRequest("invalid_value", param+".filename", "an input_file with file_data needs a filename")
		}
		mediaType, data, ok := parseDataURL(*p.FileData)
		if !ok || mediaType == "" {
			return invalidRequest("invalid_value", param+".file_data", "file_data must be a base64 data: URL such as data:application/pdf;base64,...")
		}
		if data == "" {
			return invalidRequest("invalid_value", param+".file_data", "the file data is empty")
		}
		if _, err := base64.StdEncoding.DecodeString(data); err != nil {
			return invalidRequest("invalid_value", param+".file_data", "the file data is not valid base64")
		}
	}
	return nil
}

// parseDataURL splits "data:<media type>;base64,<data>".
func parseDataURL(u string) (mediaType, data string, ok bool) {
	rest, ok := strings.CutPrefix(u, "data:")
	if !ok {
		return "", "", false
	}
	head, data, ok := strings.Cut(rest, ",")
	if !ok {
		return "", "", false
	}
	mediaType, ok = strings.CutSuffix(head, ";base64")
	return strings.ToLower(mediaType), data, ok
}

func slicesContains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// sanitizeErr shortens a json error for a message; it never echoes input
// beyond the decoder's own short description.
func sanitizeErr(err error) string { return clip(err.Error(), 200) }

// clip bounds s to n bytes at a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
