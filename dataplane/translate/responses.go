package translate

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unsafe"
)

// Options configures ToResponses. The zero value is usable: a nil Models
// means DefaultModels().
type Options struct {
	Models        *ModelTable
	SessionHeader string // X-Claude-Code-Session-Id request header value ("" if absent)
	// ServiceTier is sent as service_tier when set; use ParseServiceTier
	// to validate configuration (docs/translation.md §8). Empty means the backend default.
	ServiceTier string
}

// ParseServiceTier normalises a configured service tier (docs/translation.md §8):
// "fast" and "priority" give "priority"; "flex", "auto" and "default" pass
// through; case and surrounding space are ignored; "" gives "".
func ParseServiceTier(s string) (string, error) {
	switch v := strings.ToLower(strings.TrimSpace(s)); v {
	case "":
		return "", nil
	case "fast", "priority":
		return "priority", nil
	case "flex", "auto", "default":
		return v, nil
	}
	return "", fmt.Errorf("service tier %q is invalid; choices are fast, priority, flex, auto, default", bounded(s))
}

// Turn is one translated request, ready for the upstream socket. It is
// immutable once built.
type Turn struct {
	RequestedModel string // echoed back to the client
	Model          string // upstream model
	Effort         string // reasoning effort sent upstream, "" when none
	PromptCacheKey string
	Stream         bool // what the client asked for downstream
	// Input holds the full input items, each compact JSON with sorted keys
	// (the canonical form of docs/pool.md §3.1, except that reasoning items keep
	// their summary because the backend requires it; compare with
	// CanonicalItem).
	Input                []json.RawMessage
	EstimatedInputTokens int  // count_tokens estimate of the request (docs/translation.md §10)
	ContextWindow        int  // reported window of the upstream model
	Lite                 bool // a Responses-Lite model (docs/translation.md §2.3)

	instructions      string
	serviceTier       string
	tools             []byte // rendered JSON array, nil when no tools survive
	toolChoice        []byte // rendered JSON value, nil when not sent
	parallelToolCalls bool   // send parallel_tool_calls:false
	reasoning         []byte // rendered JSON object, nil when no effort
	textFormat        []byte // rendered text.format object, nil when none (docs/translation.md §1.3)
	required          map[string][]string
	// built is Input as ToResponses produced it: CreateFrame skips the
	// validation of items that are these very byte slices.
	built []json.RawMessage
}

// defaultInstructions is sent when the system prompt is empty (docs/translation.md §3).
const defaultInstructions = "You are a coding assistant."

const billingHeaderPrefix = "x-anthropic-billing-header:"

// Claude Code's compaction request markers (docs/translation.md §5.2).
const (
	compactionMarker1 = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."
	compactionMarker2 = "REMINDER: Do NOT call any tools. Respond with plain text only"
)

// placeholderTool is Claude Code's tool-search placeholder: it only keeps
// deferred loading active and is never sent upstream.
const placeholderTool = "DeferredToolPlaceholder"

// ToResponses translates a decoded Anthropic request into a Turn
// (docs/translation.md §1 to §8). Decisions the original TypeScript clodex
// did not make:
//
//   - Effort comes from output_config.effort; when absent and thinking is
//     enabled with budget_tokens, the budget picks it: <= 4096 low,
//     <= 16384 medium, above high (Claude Code with claude-sonnet-4-5 sends
//     31999 and no output_config, which gives high). The model rules of
//     docs/translation.md §6 then apply.
//   - tool_choice {"type":"none"} is sent as "none";
//     disable_parallel_tool_use sends parallel_tool_calls:false.
//   - Tool search: the DeferredToolPlaceholder tool is never sent; a tool
//     with defer_loading is sent once a tool_reference names it; a
//     tool_reference block becomes the text "Tool <name> is now
//     available." (a tool_result made only of references becomes those
//     lines, one per reference).
func ToResponses(req *MessagesRequest, opts Options) (*Turn, error) {
	if req == nil {
		return nil, errors.New("translate request: nil request")
	}
	models := opts.Models
	if models == nil {
		models = DefaultModels()
	}
	upstream := models.Resolve(req.model)
	t := &Turn{
		RequestedModel: req.model,
		Model:          upstream,
		Stream:         req.stream,
		ContextWindow:  models.ContextWindow(upstream),
		required:       map[string][]string{},
	}

	stripped := stripBillingHeader(req.system)
	t.instructions = strings.TrimSpace(stripped)
	if t.instructions == "" {
		t.instructions = defaultInstructions
	}

	upTools := selectTools(req)
	if len(upTools) > 0 {
		size := 2
		for _, tl := range upTools {
			size += len(`{"type":"function","name":,"description":,"parameters":},`) + len(tl.name) + len(tl.description) + len(tl.schema) + 16
		}
		buf := make([]byte, 1, size+size/16)
		buf[0] = '['
		for i, tl := range upTools {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, `{"type":"function","name":`...)
			buf = appendString(buf, tl.name)
			buf = append(buf, `,"description":`...)
			buf = appendString(buf, tl.description)
			buf = append(buf, `,"parameters":`...)
			buf = append(buf, tl.schema...)
			buf = append(buf, '}')
			if len(tl.required) > 0 {
				t.required[tl.name] = tl.required
			}
		}
		t.tools = append(buf, ']')
		t.toolChoice, t.parallelToolCalls = mapToolChoice(req)
	}

	t.Effort = effortFor(req, upstream)
	t.Lite = models.Lite(upstream)
	if t.Effort != "" || t.Lite {
		r := []byte{'{'}
		if t.Effort != "" {
			r = append(r, `"effort":`...)
			r = appendString(r, t.Effort)
			if t.Effort != "none" && !strings.Contains(upstream, "codex-spark") {
				r = append(r, `,"summary":"detailed"`...)
			}
		}
		if t.Lite {
			if len(r) > 1 {
				r = append(r, ',')
			}
			r = append(r, `"context":"all_turns"`...)
		}
		t.reasoning = append(r, '}')
	}
	t.textFormat = req.format
	if tier, err := ParseServiceTier(opts.ServiceTier); err == nil {
		t.serviceTier = tier
	}

	if id := sessionID(req.metadataUserID, opts.SessionHeader); id != "" {
		t.PromptCacheKey = "relay-session-" + hash32(id)
	} else {
		t.PromptCacheKey = "relay-" + promptHash(stripped, upTools)
	}

	t.Input = buildInput(req, upstream)
	if len(t.Input) == 0 {
		return nil, reqErr("messages", "nothing would reach the model: every message is empty once unsigned thinking, redacted thinking and blank system text are left out")
	}
	t.built = slices.Clone(t.Input)
	t.EstimatedInputTokens = req.estimate
	return t, nil
}

// promptHash is hash32 of the system prompt, a NUL, then each tool's name,
// description and schema separated by 0x01, tools separated by 0x02.
func promptHash(system string, tools []tool) string {
	h := sha256.New()
	h.Write([]byte(system))
	h.Write([]byte{0})
	for i, tl := range tools {
		if i > 0 {
			h.Write([]byte{0x02})
		}
		h.Write([]byte(tl.name))
		h.Write([]byte{0x01})
		h.Write([]byte(tl.description))
		h.Write([]byte{0x01})
		h.Write(tl.schema)
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

func hash32(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}

// stripBillingHeader removes Claude Code's billing line from each system
// block and joins the blocks with a newline (docs/translation.md §3).
func stripBillingHeader(blocks []string) string {
	parts := make([]string, 0, len(blocks))
	for _, b := range blocks {
		if strings.HasPrefix(b, billingHeaderPrefix) {
			_, rest, ok := strings.Cut(b, "\n")
			if !ok {
				continue
			}
			b = rest
		}
		parts = append(parts, b)
	}
	return strings.Join(parts, "\n")
}

func isToolSearchTool(t tool, typ string) bool {
	return strings.HasPrefix(typ, "tool_search_tool") || strings.Contains(t.name, "tool_search") || t.name == "ToolSearch"
}

// selectTools returns the tools sent upstream (docs/translation.md §5.1).
func selectTools(req *MessagesRequest) []tool {
	if len(req.tools) == 0 {
		return nil
	}
	referenced := referencedTools(req.messages)
	out := make([]tool, 0, len(req.tools))
	for _, t := range req.tools {
		switch {
		case t.server, t.name == placeholderTool:
			continue
		case t.deferred && !referenced[t.name] && !isToolSearchTool(t, ""):
			continue
		}
		out = append(out, t)
	}
	return out
}

// referencedTools collects tool names named by tool_reference blocks
// anywhere in the history (including inside tool results). Server tool
// blocks such as tool_search_tool_result are refused while decoding: the
// backend never runs Anthropic's server tools, so no history made through
// the data plane has them.
func referencedTools(msgs []message) map[string]bool {
	refs := map[string]bool{}
	var walk func([]block)
	walk = func(bs []block) {
		for _, b := range bs {
			switch b.typ {
			case "tool_reference":
				refs[b.toolName] = true
			case "tool_result":
				walk(b.content)
			}
		}
	}
	for _, m := range msgs {
		walk(m.content)
	}
	return refs
}

func mapToolChoice(req *MessagesRequest) (choice []byte, noParallel bool) {
	if isCompaction(req) {
		choice = []byte(`"none"`)
	}
	tc := req.toolChoice
	if tc == nil {
		return choice, false
	}
	if choice == nil {
		switch tc.typ {
		case "auto":
			choice = []byte(`"auto"`)
		case "any":
			choice = []byte(`"required"`)
		case "none":
			choice = []byte(`"none"`)
		case "tool":
			choice = appendString([]byte(`{"type":"function","name":`), tc.name)
			choice = append(choice, '}')
		}
	}
	return choice, tc.disableParallelToolUse
}

func isCompaction(req *MessagesRequest) bool {
	if req.hasDiagnostics || len(req.messages) == 0 {
		return false
	}
	found := false
	for _, t := range req.tools {
		if t.name == "StructuredOutput" {
			found = true
		}
	}
	last := req.messages[len(req.messages)-1]
	if !found || last.role != "user" {
		return false
	}
	var text strings.Builder
	for _, b := range last.content {
		if b.typ == "text" {
			text.WriteString(b.text)
			text.WriteByte('\n')
		}
	}
	s := text.String()
	return strings.Contains(s, compactionMarker1) && strings.Contains(s, compactionMarker2)
}

// EffortFromBudget maps thinking.budget_tokens to an effort: <= 4096 low,
// <= 16384 medium, above high; "" for a non-positive budget.
func EffortFromBudget(budget int) string {
	switch {
	case budget <= 0:
		return ""
	case budget <= 4096:
		return "low"
	case budget <= 16384:
		return "medium"
	default:
		return "high"
	}
}

func effortFor(req *MessagesRequest, upstream string) string {
	e := strings.ToLower(req.effort)
	if e == "" && req.thinkingType == "enabled" {
		e = EffortFromBudget(req.thinkingBudget)
	}
	if e == "" || !prefersResponses(upstream) {
		return ""
	}
	if strings.HasPrefix(upstream, "gpt-5.6") {
		switch e {
		case "none", "low", "medium", "high", "xhigh", "max":
			return e
		}
		return ""
	}
	switch e {
	case "low", "medium", "high":
		return e
	case "xhigh":
		return "high"
	}
	return ""
}

// prefersResponses reports whether reasoning effort applies to the model
// (docs/translation.md §6).
func prefersResponses(model string) bool {
	for _, p := range []string{"gpt-5-codex", "gpt-5-pro", "gpt-5.2-pro", "o3", "o4"} {
		if strings.HasPrefix(model, p) {
			return true
		}
	}
	if strings.HasPrefix(model, "gpt-") && strings.Contains(model, "-codex") {
		return true
	}
	if rest, ok := strings.CutPrefix(model, "gpt-5."); ok {
		end := 0
		for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
			end++
		}
		if n, err := strconv.Atoi(rest[:end]); err == nil && n >= 4 {
			return true
		}
	}
	return false
}

// sessionID extracts the Claude session id (docs/translation.md §7).
func sessionID(userID, header string) string {
	if userID != "" {
		var m struct {
			SessionID any `json:"session_id"`
		}
		if json.Unmarshal([]byte(userID), &m) == nil {
			if s, ok := m.SessionID.(string); ok && validUUID(strings.TrimSpace(s)) {
				return strings.ToLower(strings.TrimSpace(s))
			}
		}
	}
	if h := strings.TrimSpace(header); validUUID(h) {
		return strings.ToLower(h)
	}
	return ""
}

// validUUID checks 8-4-4-4-12 hex with version 1-8 and variant 8, 9, a or b.
func validUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
			continue
		}
		if !isHex(c) {
			return false
		}
	}
	if v := s[14]; v < '1' || v > '8' {
		return false
	}
	switch s[19] {
	case '8', '9', 'a', 'b', 'A', 'B':
		return true
	}
	return false
}

// CreateFrame renders the response.create frame (docs/translation.md §8) with the given
// input items (nil means the full t.Input) and previous_response_id when
// previousResponseID is non-empty.
func (t *Turn) CreateFrame(previousResponseID string, input []json.RawMessage) ([]byte, error) {
	if input == nil {
		input = t.Input
	}
	size := 512 + len(t.instructions) + len(t.tools) + len(t.textFormat)
	for _, it := range input {
		size += len(it) + 1
	}
	buf := make([]byte, 0, size)
	buf = append(buf, `{"type":"response.create","model":`...)
	buf = appendString(buf, t.Model)
	buf = append(buf, `,"instructions":`...)
	buf = appendString(buf, t.instructions)
	buf = append(buf, `,"input":[`...)
	own := t.ownOffset(input)
	for i, it := range input {
		if !(own >= 0 && own+i < len(t.built) && sameBytes(it, t.built[own+i])) && !validJSON(it) {
			return nil, fmt.Errorf("create frame: input item %d is not valid JSON", i)
		}
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, it...)
	}
	buf = append(buf, ']')
	if t.tools != nil {
		buf = append(buf, `,"tools":`...)
		buf = append(buf, t.tools...)
		if t.toolChoice != nil {
			buf = append(buf, `,"tool_choice":`...)
			buf = append(buf, t.toolChoice...)
		}
		if t.parallelToolCalls && !t.Lite {
			buf = append(buf, `,"parallel_tool_calls":false`...)
		}
	}
	if t.Lite {
		buf = append(buf, `,"parallel_tool_calls":false`...)
	}
	if t.reasoning != nil {
		buf = append(buf, `,"reasoning":`...)
		buf = append(buf, t.reasoning...)
	}
	if t.textFormat != nil {
		buf = append(buf, `,"text":{"format":`...)
		buf = append(buf, t.textFormat...)
		buf = append(buf, '}')
	}
	buf = append(buf, `,"store":false,"include":["reasoning.encrypted_content"],"prompt_cache_key":`...)
	buf = appendString(buf, t.PromptCacheKey)
	if t.serviceTier != "" {
		buf = append(buf, `,"service_tier":`...)
		buf = appendString(buf, t.serviceTier)
	}
	buf = append(buf, `,"stream":true`...)
	if previousResponseID != "" {
		buf = append(buf, `,"previous_response_id":`...)
		buf = appendString(buf, previousResponseID)
	}
	return append(buf, '}'), nil
}

// ownOffset returns k when input[0] is the item t.built[k] itself (the
// same bytes in memory, as when the gateway passes Input or a tail of
// it), else -1.
func (t *Turn) ownOffset(input []json.RawMessage) int {
	if len(input) == 0 {
		return -1
	}
	for k, it := range t.built {
		if sameBytes(input[0], it) {
			return k
		}
	}
	return -1
}

// sameBytes reports whether a and b are the same non-empty byte slice.
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && len(a) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// Instructions is the instructions text sent upstream.
func (t *Turn) Instructions() string { return t.instructions }

// RequiredProps returns the schema's required list of the named tool (used
// by the filler strip, docs/translation.md §9.4).
func (t *Turn) RequiredProps(tool string) []string { return t.required[tool] }

// Check returns nil when the table accepts requested, else a *RequestError
// for the model field that lists what is accepted.
func (m *ModelTable) Check(requested string) error {
	if m == nil {
		m = DefaultModels()
	}
	if m.Accepts(requested) {
		return nil
	}
	return m.refusal(requested)
}

// Accepts reports whether requested is a name the table serves: one an
// alias matches, a known upstream model or an alias target, or any name
// with passthrough.
func (m *ModelTable) Accepts(requested string) bool {
	if m == nil {
		m = DefaultModels()
	}
	name := normalizeModel(requested)
	if m.passthrough {
		return true
	}
	if _, ok := lookup(m.configured, name); ok {
		return true
	}
	if _, ok := lookup(m.defaults, name); ok {
		return true
	}
	return slices.Contains(upstreamModels, name) || m.isTarget(name)
}

func (m *ModelTable) isTarget(name string) bool {
	for _, list := range [][]alias{m.configured, m.defaults} {
		for _, a := range list {
			if a.model == name {
				return true
			}
		}
	}
	return false
}

// Resolve returns the upstream model for a requested name.
func (m *ModelTable) Resolve(requested string) string {
	name := normalizeModel(requested)
	if m == nil {
		m = DefaultModels()
	}
	if model, ok := lookup(m.configured, name); ok {
		return model
	}
	if model, ok := lookup(m.defaults, name); ok {
		return model
	}
	return name
}

func lookup(list []alias, name string) (string, bool) {
	for _, a := range list {
		if a.prefix && strings.HasPrefix(name, a.pattern) || !a.prefix && name == a.pattern {
			return a.model, true
		}
	}
	return "", false
}

// normalizeModel strips a trailing "[1m]" (any case) and a leading
// "models/", and reduces the route ids of docs/translation.md §2.1 to their model:
// "clodex:<provider>:<model>" and "anthropic-<provider>__<model>".
func normalizeModel(name string) string {
	name = strings.TrimSpace(name)
	if n := len(name); n >= 4 && strings.EqualFold(name[n-4:], "[1m]") {
		name = name[:n-4]
	}
	name = strings.TrimPrefix(name, "models/")
	if rest, ok := strings.CutPrefix(name, "clodex:"); ok {
		if _, model, ok := strings.Cut(rest, ":"); ok && model != "" {
			return model
		}
	}
	if rest, ok := strings.CutPrefix(name, "anthropic-"); ok {
		if _, model, ok := strings.Cut(rest, "__"); ok && model != "" {
			return model
		}
	}
	return name
}

// ContextWindow is the context window reported to clients for an upstream
// model: 95 % of 272,000 (258,400) for the gpt-5 family served by the
// ChatGPT backend, 200,000 otherwise (docs/translation.md §2.2).
func (m *ModelTable) ContextWindow(upstream string) int {
	if strings.HasPrefix(normalizeModel(upstream), "gpt-5") {
		return oauthRawWindow * 95 / 100
	}
	return defaultContextWindow
}

// liteModels are the upstream models served by Responses-Lite
// (docs/translation.md §2.3).
var liteModels = []string{"gpt-5.6-luna"}

// Lite reports whether an upstream model is a Responses-Lite model: its
// frames carry parallel_tool_calls:false and reasoning.context "all_turns"
// (docs/translation.md §2.3). The backend also expects the version and
// x-openai-internal-codex-responses-lite headers on its upgrade, which
// dataplane/upstream does not send.
func (m *ModelTable) Lite(upstream string) bool {
	name := normalizeModel(upstream)
	for _, l := range liteModels {
		if name == l || strings.HasPrefix(name, l+"-") {
			return true
		}
	}
	return false
}

// defaultContextWindow is reported for models with no better knowledge
// (docs/translation.md §2.2).
const defaultContextWindow = 200_000

// oauthRawWindow is the raw context window of the gpt-5 family on the
// ChatGPT backend; clients are told 95 % of it (docs/translation.md §2.2).
const oauthRawWindow = 272_000
