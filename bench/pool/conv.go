package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/clodex/clodex/internal/captures"

	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/translate"
)

// toolResultBytes is the size of every tool result a cc turn adds.
const toolResultBytes = 2048

// template is the fixture's request body without its messages, plus its
// first user message's content blocks (the system reminder and the
// prompt) and the system-role message that follows it.
type template struct {
	rest      map[string]json.RawMessage // body fields except messages and metadata
	reminder  json.RawMessage            // first content block of the first user message
	sysMsg    json.RawMessage            // the fixture's role:system message
	firstText string                     // the fixture's prompt ("say hi")
}

var truncated = regexp.MustCompile(`\s*…\[truncated; (\d+) chars total\]$`)

// restore pads a string the capture truncated back to its recorded length
// (in characters), so request sizes are the real ones.
func restore(s string) string {
	m := truncated.FindStringSubmatchIndex(s)
	if m == nil {
		return s
	}
	total, err := strconv.Atoi(s[m[2]:m[3]])
	if err != nil {
		return s[:m[0]]
	}
	s = s[:m[0]]
	if pad := total - len([]rune(s)); pad > 0 {
		s += strings.Repeat("lorem ipsum ", pad/12+1)[:pad]
	}
	return s
}

// restoreAll applies restore to every string in v (decoded JSON).
func restoreAll(v any) any {
	switch x := v.(type) {
	case string:
		return restore(x)
	case []any:
		for i := range x {
			x[i] = restoreAll(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = restoreAll(x[k])
		}
	}
	return v
}

// expandSchema rebuilds a tool's input_schema the capture summarised as
// "input_schema.properties" (names) and "input_schema.required".
func expandSchema(tool map[string]any) {
	names, ok := tool["input_schema.properties"].([]any)
	if !ok {
		return
	}
	props := map[string]any{}
	for _, n := range names {
		name := fmt.Sprint(n)
		props[name] = map[string]any{"type": "string", "description": "The " + name + " of the call, as described in the tool's documentation."}
	}
	schema := map[string]any{"type": "object", "properties": props}
	if req, ok := tool["input_schema.required"].([]any); ok {
		schema["required"] = req
	}
	delete(tool, "input_schema.properties")
	delete(tool, "input_schema.required")
	tool["input_schema"] = schema
}

// defaultCapture is the Claude Code 2.1.332 first turn the cc shape is
// built from when --fixture is not given (package captures).
const defaultCapture = "claude-code/cc-2.1.332-messages-request-custom-model.json"

// loadTemplate reads a Claude Code capture file (an object with "body",
// the Messages request) into a template; path "" is defaultCapture.
func loadTemplate(path string) (*template, error) {
	var (
		raw []byte
		err error
	)
	if path == "" {
		path = "captures:" + defaultCapture
		raw, err = captures.ReadFile(defaultCapture)
	} else {
		raw, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("load fixture: %w", err)
	}
	var doc struct {
		Body map[string]any `json:"body"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("load fixture %s: %w", path, err)
	}
	if doc.Body == nil {
		return nil, fmt.Errorf("load fixture %s: no \"body\" object; want a capture with the Messages request under \"body\"", path)
	}
	body := restoreAll(doc.Body).(map[string]any)
	tools, _ := body["tools"].([]any)
	for _, t := range tools {
		if m, ok := t.(map[string]any); ok {
			expandSchema(m)
		}
	}
	msgs, _ := body["messages"].([]any)
	tp := &template{rest: map[string]json.RawMessage{}}
	for _, m := range msgs {
		msg, _ := m.(map[string]any)
		content, _ := msg["content"].([]any)
		switch msg["role"] {
		case "user":
			if tp.reminder != nil || len(content) < 2 {
				continue
			}
			last, _ := content[len(content)-1].(map[string]any)
			text, _ := last["text"].(string)
			if tp.reminder, err = json.Marshal(content[0]); err != nil {
				return nil, fmt.Errorf("load fixture %s: %w", path, err)
			}
			tp.firstText = text
		case "system":
			if tp.sysMsg, err = json.Marshal(msg); err != nil {
				return nil, fmt.Errorf("load fixture %s: %w", path, err)
			}
		}
	}
	if tp.reminder == nil || tp.firstText == "" {
		return nil, fmt.Errorf("load fixture %s: no user message with a system reminder and a prompt; want Claude Code's first request", path)
	}
	for k, v := range body {
		if k == "messages" || k == "metadata" {
			continue
		}
		if tp.rest[k], err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("load fixture %s: %w", path, err)
		}
	}
	return tp, nil
}

// conversation is one Claude Code session's history as the client holds
// it.
type conversation struct {
	session  string
	messages []json.RawMessage
}

// sessionUUID derives Claude Code's session id (a version-4 UUID, which
// translate requires before it keys the prompt cache by session) from a
// name.
func sessionUUID(name string) string {
	h := sha256.Sum256([]byte(name))
	h[6] = h[6]&0x0f | 0x40
	h[8] = h[8]&0x3f | 0x80
	x := hex.EncodeToString(h[:16])
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}

// newConversation starts the session named name, whose first user message
// is the fixture's with prompt as its text.
func (tp *template) newConversation(name, prompt string) *conversation {
	session := sessionUUID(name)
	first := map[string]any{"role": "user", "content": []any{tp.reminder, map[string]any{"type": "text", "text": prompt}}}
	c := &conversation{session: session, messages: []json.RawMessage{mustJSON(first)}}
	if tp.sysMsg != nil {
		c.messages = append(c.messages, tp.sysMsg)
	}
	return c
}

// body renders the conversation as a Messages request body.
func (tp *template) body(c *conversation) []byte {
	m := make(map[string]json.RawMessage, len(tp.rest)+2)
	for k, v := range tp.rest {
		m[k] = v
	}
	m["messages"] = mustJSON(c.messages)
	uid := mustJSON(map[string]string{"device_id": "bench", "account_uuid": "", "session_id": c.session})
	m["metadata"] = mustJSON(map[string]string{"user_id": string(uid)})
	return mustJSON(m)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("encode %T: %v", v, err)) // only called on values built here
	}
	return b
}

// prepared is one request ready for the pool.
type prepared struct {
	turn  *translate.Turn
	items [][]byte // canonical input items
	part  pool.Partition
}

// prepare translates the conversation's next request as the gateway does.
func prepare(tp *template, c *conversation, account string) (*prepared, error) {
	req, err := translate.DecodeRequest(tp.body(c))
	if err != nil {
		return nil, fmt.Errorf("prepare turn: %w", err)
	}
	turn, err := translate.ToResponses(req, translate.Options{SessionHeader: c.session})
	if err != nil {
		return nil, fmt.Errorf("prepare turn: %w", err)
	}
	items := make([][]byte, len(turn.Input))
	for i, it := range turn.Input {
		if items[i], err = translate.CanonicalItem(it); err != nil {
			return nil, fmt.Errorf("prepare turn: canonicalize input item %d: %w", i, err)
		}
	}
	return &prepared{turn: turn, items: items,
		part: pool.Partition{Account: account, Model: turn.Model, Effort: turn.Effort, PromptCacheKey: turn.PromptCacheKey}}, nil
}

// turnResult is what one turn sent and received.
type turnResult struct {
	decision             string
	inputBytes, fullIn   int // input item bytes sent, and of the full history
	frameBytes, fullFrm  int // response.create bytes sent, and with the full history
	toolUses             []string
	assistant            json.RawMessage // {"role":"assistant","content":[...]}
	inputTok, cachedToks int
}

// drive runs one acquired lease to the end of its response and completes
// it (the socket stays a head) or discards it on any failure. closeAfter
// discards it after a successful response instead, as the original design
// did with a parallel socket.
func drive(ctx context.Context, pr *prepared, l *pool.Lease, msgID string, closeAfter bool) (turnResult, error) {
	res := turnResult{decision: l.Decision}
	sent := pr.turn.Input[l.Delta:]
	frame, err := pr.turn.CreateFrame(l.PreviousResponseID, sent)
	if err != nil {
		l.Discard("render failed")
		return res, fmt.Errorf("drive turn: %w", err)
	}
	full, err := pr.turn.CreateFrame("", nil)
	if err != nil {
		l.Discard("render failed")
		return res, fmt.Errorf("drive turn: %w", err)
	}
	res.frameBytes, res.fullFrm = len(frame), len(full)
	for _, it := range sent {
		res.inputBytes += len(it)
	}
	for _, it := range pr.turn.Input {
		res.fullIn += len(it)
	}
	if err := l.Conn.Send(ctx, frame); err != nil {
		l.Discard("send failed")
		return res, fmt.Errorf("drive turn: send response.create: %w", err)
	}
	col := translate.NewCollector()
	st := translate.NewStream(pr.turn, col, msgID)
	for {
		ev, err := l.Conn.Next(ctx)
		if err != nil {
			l.Discard("read failed")
			return res, fmt.Errorf("drive turn: read upstream: %w", err)
		}
		state, err := st.Handle(ev)
		if err != nil {
			l.Discard("collect failed")
			return res, fmt.Errorf("drive turn: %w", err)
		}
		switch state {
		case translate.StateFailed:
			l.Discard("response failed")
			f := st.Failure()
			return res, fmt.Errorf("drive turn: response failed: %s (decision %s)", f.Code, l.Decision)
		case translate.StateCompleted:
			if err := st.Finish(); err != nil {
				l.Discard("collect failed")
				return res, fmt.Errorf("drive turn: %w", err)
			}
			u := st.Usage()
			res.inputTok = u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens
			res.cachedToks = u.CacheReadInputTokens
			if closeAfter {
				l.Discard("isolated socket done")
			} else {
				out := st.OutputItems()
				items := make([][]byte, len(out))
				for i, it := range out {
					items[i] = it
				}
				l.Complete(st.ResponseID(), items, pool.Usage{InputTokens: int64(res.inputTok), CachedTokens: int64(res.cachedToks)})
			}
			msg, err := col.Message()
			if err != nil {
				return res, fmt.Errorf("drive turn: %w", err)
			}
			var m struct {
				Content []json.RawMessage `json:"content"`
			}
			if err := json.Unmarshal(msg, &m); err != nil {
				return res, fmt.Errorf("drive turn: decode collected message: %w", err)
			}
			for _, blk := range m.Content {
				var b struct{ Type, ID string }
				if json.Unmarshal(blk, &b) == nil && b.Type == "tool_use" {
					res.toolUses = append(res.toolUses, b.ID)
				}
			}
			res.assistant = mustJSON(map[string]any{"role": "assistant", "content": m.Content})
			return res, nil
		}
	}
}

// ccDirective is the scripted model's instruction for turn i (0-based) of
// a cc conversation of n turns: reasoning and a Bash call, or on the last
// turn a final reply.
func ccDirective(i, n int) string {
	if i == n-1 {
		return "#sim reasoning All packages pass now\n#sim reply All tests pass now. I fixed the failing assertions in the affected packages."
	}
	return fmt.Sprintf("#sim reasoning Looking at the failures | Running package %d next\n#sim call Bash {\"command\":\"go test ./pkg/%d/...\",\"description\":\"Run the tests of package %d\"}", i, i, i)
}

// toolResult is a 2 KB tool result for call id, ending with the
// directive of the next turn.
func toolResult(conv string, i int, id, directive string) json.RawMessage {
	seed := fmt.Sprintf("%s-%d src/module/file.go:%d: ok; ", conv, i, 40+i)
	body := strings.Repeat(seed, toolResultBytes/len(seed)+1)[:toolResultBytes-len(directive)-1] + "\n" + directive
	return mustJSON(map[string]any{"type": "tool_result", "tool_use_id": id, "content": body})
}

// runConversation runs turns turns of a conversation to completion on p.
// turns == 1 is the one-message shape (the fixture's prompt); more is the
// cc shape. observe, when set, sees every turn's result.
func runConversation(ctx context.Context, p *pool.Pool, tp *template, account, session string, turns int, observe func(turnResult)) error {
	prompt := tp.firstText
	if turns > 1 {
		prompt = "Fix the failing tests in session " + session + ".\n" + ccDirective(0, turns)
	}
	c := tp.newConversation(session, prompt)
	for i := range turns {
		pr, err := prepare(tp, c, account)
		if err != nil {
			return err
		}
		l, err := p.Acquire(ctx, pr.part, pr.items)
		if err != nil {
			return fmt.Errorf("turn %d: acquire: %w", i+1, err)
		}
		res, err := drive(ctx, pr, l, fmt.Sprintf("msg_%s_%d", session, i), false)
		if err != nil {
			return fmt.Errorf("turn %d: %w", i+1, err)
		}
		if observe != nil {
			observe(res)
		}
		if i == turns-1 {
			break
		}
		if len(res.toolUses) == 0 {
			return fmt.Errorf("turn %d: the response has no tool call; want the scripted Bash call", i+1)
		}
		blocks := make([]json.RawMessage, len(res.toolUses))
		for k, id := range res.toolUses {
			blocks[k] = toolResult(session, i, id, ccDirective(i+1, turns))
		}
		c.messages = append(c.messages, res.assistant, mustJSON(map[string]any{"role": "user", "content": blocks}))
	}
	return nil
}
