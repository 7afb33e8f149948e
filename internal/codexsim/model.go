package codexsim

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// plan is what the scripted model does for one response, parsed from the
// directives in the newest user text.
type plan struct {
	delay         time.Duration
	errCode       string // #sim error
	errStatus     int    // 0 = no status field
	failCode      string // #sim fail
	contextLength bool   // #sim context-length
	stall         bool   // #sim stall
	forget        bool   // #sim forget
	reasoning     [][]string
	calls         []plannedCall
	reply         *string
	incomplete    string // #sim incomplete
	usageLimit    bool   // #sim usage-limit
	usageResetsIn time.Duration
	usagePlan     string // "" = Faults.UsageLimitPlan
	structured    []byte // the JSON answer to a json_schema text.format; reply and calls are ignored
	newest        string // the newest user text (or tool output)
	toolOutput    bool   // newest is a function_call_output
}

type plannedCall struct {
	name string
	args string // compact JSON object
}

const directivePrefix = "#sim"

// newestText returns the newest user text of input: when the last item is
// a function_call_output, its output; otherwise the input_text parts of the
// last user message, joined by newlines.
func newestText(input []json.RawMessage) (text string, toolOutput bool) {
	if len(input) == 0 {
		return "", false
	}
	var last struct {
		Type   string          `json:"type"`
		Output json.RawMessage `json:"output"`
	}
	if json.Unmarshal(input[len(input)-1], &last) == nil && (last.Type == "function_call_output" || last.Type == "custom_tool_call_output") {
		return outputText(last.Output), true
	}
	for i := len(input) - 1; i >= 0; i-- {
		var msg struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(input[i], &msg) != nil || msg.Role != "user" {
			continue
		}
		return contentText(msg.Content, "input_text"), false
	}
	return "", false
}

// outputText reads a function_call_output's output: a string, or an array
// of content parts whose text is joined.
func outputText(r json.RawMessage) string {
	var s string
	if json.Unmarshal(r, &s) == nil {
		return s
	}
	return contentText(r, "")
}

// contentText reads message content: a string, or the text of the parts of
// type partType ("" = any part with a text field), joined by newlines.
func contentText(r json.RawMessage, partType string) string {
	var s string
	if json.Unmarshal(r, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(r, &parts) != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range parts {
		if partType != "" && p.Type != partType {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.Text)
	}
	return b.String()
}

// parsePlan reads the #sim directives in text. A malformed directive is an
// error naming the line and the syntax.
func parsePlan(text string, toolOutput bool) (*plan, *wireError) {
	p := &plan{newest: text, toolOutput: toolOutput}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line != directivePrefix && !strings.HasPrefix(line, directivePrefix+" ") && !strings.HasPrefix(line, directivePrefix+"\t") {
			continue
		}
		rest := strings.TrimSpace(strings.TrimPrefix(line, directivePrefix))
		verb, arg, _ := strings.Cut(rest, " ")
		arg = strings.TrimSpace(arg)
		bad := func(syntax string) *wireError {
			return invalidRequest("invalid_sim_directive", "input", "bad directive %q; want %s", clip(line, 120), syntax)
		}
		switch verb {
		case "reply":
			r := strings.TrimPrefix(strings.TrimPrefix(rest, "reply"), " ")
			p.reply = &r
		case "call":
			name, js, _ := strings.Cut(arg, " ")
			js = strings.TrimSpace(js)
			if name == "" {
				return nil, bad("#sim call <NAME> <JSON-OBJECT>")
			}
			if js == "" {
				js = "{}"
			}
			var buf bytes.Buffer
			if !strings.HasPrefix(js, "{") || json.Compact(&buf, []byte(js)) != nil {
				return nil, bad("#sim call <NAME> <JSON-OBJECT> with a JSON object as arguments")
			}
			p.calls = append(p.calls, plannedCall{name: name, args: buf.String()})
		case "reasoning":
			var parts []string
			for _, s := range strings.Split(arg, "|") {
				parts = append(parts, strings.TrimSpace(s))
			}
			p.reasoning = append(p.reasoning, parts)
		case "fail":
			if arg == "" || strings.ContainsAny(arg, " \t") {
				return nil, bad("#sim fail <CODE>")
			}
			p.failCode = arg
		case "incomplete":
			if arg == "" || strings.ContainsAny(arg, " \t") {
				return nil, bad("#sim incomplete <REASON>")
			}
			p.incomplete = arg
		case "error":
			f := strings.Fields(arg)
			if len(f) < 1 || len(f) > 2 {
				return nil, bad("#sim error <CODE> [STATUS]")
			}
			p.errCode = f[0]
			p.errStatus = 400
			if len(f) == 2 {
				n, err := strconv.Atoi(f[1])
				if err != nil || (n != 0 && (n < 400 || n > 599)) {
					return nil, bad("#sim error <CODE> [STATUS] with STATUS 400-599 (0 = no status field)")
				}
				p.errStatus = n
			}
		case "delay":
			d, err := time.ParseDuration(arg)
			if err != nil || d < 0 || d > time.Hour {
				return nil, bad("#sim delay <DURATION> in Go syntax, 0 to 1h, such as 250ms")
			}
			p.delay += d
		case "usage-limit":
			f := strings.Fields(arg)
			if len(f) < 1 || len(f) > 2 {
				return nil, bad("#sim usage-limit <SECONDS> [PLAN]")
			}
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil || n < 0 || n > 90*24*3600 {
				return nil, bad("#sim usage-limit <SECONDS> [PLAN] with SECONDS a whole number from 0 to 7776000 (90 days)")
			}
			if len(f) == 2 && !validCode(f[1]) {
				return nil, bad("#sim usage-limit <SECONDS> [PLAN] with PLAN a plan name such as plus or pro")
			}
			p.usageLimit, p.usageResetsIn = true, time.Duration(n)*time.Second
			if len(f) == 2 {
				p.usagePlan = f[1]
			}
		case "context-length":
			p.contextLength = true
		case "stall":
			p.stall = true
		case "forget":
			p.forget = true
		default:
			return nil, bad("one of reply, call, reasoning, fail, incomplete, error, usage-limit, delay, context-length, stall, forget")
		}
	}
	return p, nil
}

// defaultReply is the text of a response without reply or call directives.
func (p *plan) defaultReply() string {
	if p.toolOutput {
		return "Tool result received: " + firstRunes(p.newest, 60)
	}
	return "Hello from clodex-sim. You said: " + firstRunes(p.newest, 60)
}

func firstRunes(s string, n int) string {
	i := 0
	for j := range s {
		if i == n {
			return s[:j]
		}
		i++
	}
	return s
}

// splitDeltas cuts s into streaming deltas: before each space, and pieces
// longer than 16 bytes at rune boundaries. The pieces concatenate to s.
func splitDeltas(s string) []string {
	const maxPiece = 16
	var out []string
	for len(s) > 0 {
		end := len(s)
		// Look for the space only where a piece may end: scanning the
		// whole rest would make a long text without spaces quadratic.
		if i := strings.IndexByte(s[1:min(len(s), maxPiece+1)], ' '); i >= 0 {
			end = i + 1
		}
		if end > maxPiece {
			end = maxPiece
			for end > 1 && !utf8.RuneStart(s[end]) {
				end--
			}
		}
		out = append(out, s[:end])
		s = s[end:]
	}
	return out
}
