package clienttest

import (
	"context"
	"testing"
	"time"
)

// ClaudeRun describes one non-interactive Claude Code run (`claude -p`).
type ClaudeRun struct {
	// BaseURL becomes ANTHROPIC_BASE_URL, e.g. "http://127.0.0.1:PORT". It
	// must point at a loopback address.
	BaseURL string
	// APIKey becomes ANTHROPIC_API_KEY (sent as x-api-key); "test-key" when empty.
	APIKey string
	// Model is passed as --model; Claude Code's default model when empty.
	Model string
	// Prompt is passed as -p; required.
	Prompt string
	// WorkDir is the working directory; a fresh temporary folder when empty.
	WorkDir string
	// ExtraArgs are appended to the command line, e.g. "--allowedTools", "Bash(touch:*)".
	ExtraArgs []string
	// ExtraEnv entries ("KEY=value") are added last and override the defaults,
	// e.g. "CLAUDE_CODE_MAX_RETRIES=0".
	ExtraEnv []string
	// Timeout bounds the run; DefaultRunTimeout when zero.
	Timeout time.Duration
}

// ClaudeResult is what a Claude Code run printed.
type ClaudeResult struct {
	// Lines are the stream-json lines of stdout, in order.
	Lines []map[string]any
	// Result is the last line whose type is "result", or nil.
	Result map[string]any
	// Stderr is everything Claude Code wrote to stderr.
	Stderr string
	// ExitCode is the exit status; -1 when the run was stopped at its timeout.
	ExitCode int
}

// Text returns the "result" string of the result line ("" when absent).
func (r ClaudeResult) Text() string {
	s, _ := r.Result["result"].(string)
	return s
}

// IsError reports the result line's is_error (true when there is no result
// line). Claude Code keeps subtype "success" even for API errors, so this is
// the field that tells failure.
func (r ClaudeResult) IsError() bool {
	if r.Result == nil {
		return true
	}
	b, _ := r.Result["is_error"].(bool)
	return b
}

// StreamEvents returns the raw Anthropic SSE events that Claude Code echoed
// as {"type":"stream_event","event":{…}} lines (--include-partial-messages).
func (r ClaudeResult) StreamEvents() []map[string]any {
	var evs []map[string]any
	for _, l := range r.Lines {
		if l["type"] != "stream_event" {
			continue
		}
		if ev, ok := l["event"].(map[string]any); ok {
			evs = append(evs, ev)
		}
	}
	return evs
}

// RunClaude runs Claude Code (bin, from [ClaudeCode]) once:
//
//	claude -p PROMPT [--model MODEL] --output-format stream-json --verbose
//	       --include-partial-messages --no-session-persistence [EXTRA ARGS]
//
// with stdin from /dev/null and an environment built from scratch: PATH, a
// fresh HOME, TERM=dumb, ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY,
// DISABLE_AUTOUPDATER=1, DISABLE_TELEMETRY=1,
// CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1, CLAUDE_CODE_MAX_RETRIES=1, then
// r.ExtraEnv. It holds the machine-wide client run lock while Claude Code
// runs. Bad input fails t; a run stopped at its timeout is reported with
// t.Errorf and ExitCode -1. A non-zero exit is not a test failure: assert on
// ExitCode and IsError.
func RunClaude(ctx context.Context, t testing.TB, bin string, r ClaudeRun) ClaudeResult {
	t.Helper()
	if r.Prompt == "" {
		t.Fatal("RunClaude: Prompt is empty; claude -p needs a prompt")
	}
	if err := checkLoopback(r.BaseURL); err != nil {
		t.Fatalf("RunClaude: %v", err)
	}
	if r.APIKey == "" {
		r.APIKey = "test-key"
	}
	if r.WorkDir == "" {
		r.WorkDir = t.TempDir()
	}
	if r.Timeout <= 0 {
		r.Timeout = DefaultRunTimeout
	}
	env := append(baseEnv(t.TempDir()),
		"ANTHROPIC_BASE_URL="+r.BaseURL,
		"ANTHROPIC_API_KEY="+r.APIKey,
		"DISABLE_AUTOUPDATER=1",
		"DISABLE_TELEMETRY=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		"CLAUDE_CODE_MAX_RETRIES=1",
	)
	env = append(env, r.ExtraEnv...)
	args := []string{"-p", r.Prompt}
	if r.Model != "" {
		args = append(args, "--model", r.Model)
	}
	args = append(args, "--output-format", "stream-json", "--verbose", "--include-partial-messages", "--no-session-persistence")
	args = append(args, r.ExtraArgs...)

	unlock := LockClientRun(ctx, t)
	res := process{bin: bin, args: args, env: env, dir: r.WorkDir, timeout: r.Timeout}.run(ctx)
	unlock()

	out := ClaudeResult{Stderr: string(res.stderr), ExitCode: res.exitCode}
	var other []string
	out.Lines, other = jsonLines(res.stdout)
	for _, l := range other {
		t.Logf("claude: non-JSON stdout line: %s", l)
	}
	for _, l := range out.Lines {
		if l["type"] == "result" {
			out.Result = l
		}
	}
	if res.err != nil {
		t.Errorf("RunClaude: %v\nstderr (last lines):\n%s", res.err, tail(out.Stderr, 20))
	}
	return out
}
