package clienttest

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// OpencodeRun describes one non-interactive opencode run (`opencode run PROMPT`) with its
// anthropic provider pointed at an Anthropic Messages API server.
type OpencodeRun struct {
	// BaseURL is the server, e.g. "http://127.0.0.1:PORT" (the provider's baseURL is
	// BaseURL + "/v1"). It must point at a loopback address.
	BaseURL string
	// APIKey is the provider's apiKey; "test-key" when empty.
	APIKey string
	// Model is the anthropic model id; "claude-sonnet-4-5" when empty.
	Model string
	// Prompt is the message; required. opencode quotes it, so a #sim directive must sit
	// on a line of its own between other lines.
	Prompt string
	// ExtraEnv entries ("KEY=value") are added last.
	ExtraEnv []string
	// Timeout bounds the run; DefaultRunTimeout when zero.
	Timeout time.Duration
	// Locked says the caller holds the client run lock, as in [NodeRun].
	Locked bool
}

// OpencodeResult is what an opencode run printed.
type OpencodeResult struct {
	Stdout, Stderr string
	// ExitCode is the exit status; -1 when the run was stopped at its timeout.
	ExitCode int
}

// RunOpencode runs opencode (bin, from [Opencode]) once, `opencode run PROMPT`, in a scratch
// working folder whose opencode.json sets the model and the anthropic provider's baseURL and
// apiKey, with stdin from /dev/null and an environment built from scratch: PATH, a fresh
// HOME, TERM=dumb, NO_COLOR=1 and the switches that keep opencode from fetching models,
// updating itself, sharing or loading plugins (no request leaves 127.0.0.1), then
// r.ExtraEnv. Bad input fails t; a run stopped at its timeout is reported with t.Errorf and
// ExitCode -1. A non-zero exit is not a test failure.
func RunOpencode(ctx context.Context, t testing.TB, bin string, r OpencodeRun) OpencodeResult {
	t.Helper()
	if r.Prompt == "" {
		t.Fatal("RunOpencode: Prompt is empty")
	}
	if err := checkLoopback(r.BaseURL); err != nil {
		t.Fatalf("RunOpencode: %v", err)
	}
	if r.APIKey == "" {
		r.APIKey = "test-key"
	}
	if r.Model == "" {
		r.Model = "claude-sonnet-4-5"
	}
	if r.Timeout <= 0 {
		r.Timeout = DefaultRunTimeout
	}
	work := t.TempDir()
	cfg, err := json.Marshal(map[string]any{
		"$schema":    "https://opencode.ai/config.json",
		"model":      "anthropic/" + r.Model,
		"autoupdate": false,
		"share":      "disabled",
		"provider": map[string]any{"anthropic": map[string]any{"options": map[string]any{
			"baseURL": r.BaseURL + "/v1", "apiKey": r.APIKey}}},
	})
	if err != nil {
		t.Fatalf("RunOpencode: config: %v", err)
	}
	if err := os.WriteFile(filepath.Join(work, "opencode.json"), cfg, 0o600); err != nil {
		t.Fatalf("RunOpencode: write opencode.json: %v", err)
	}
	env := append(baseEnv(t.TempDir()),
		"OPENCODE_DISABLE_MODELS_FETCH=1",
		"OPENCODE_DISABLE_AUTOUPDATE=1",
		"OPENCODE_DISABLE_DEFAULT_PLUGINS=1",
		"OPENCODE_DISABLE_LSP_DOWNLOAD=1",
		"OPENCODE_DISABLE_SHARE=1",
		"OPENCODE_DISABLE_CLAUDE_CODE=1",
	)
	env = append(env, r.ExtraEnv...)
	if !r.Locked {
		defer LockClientRun(ctx, t)()
	}
	res := process{bin: bin, args: []string{"run", r.Prompt}, env: env, dir: work, timeout: r.Timeout}.run(ctx)
	out := OpencodeResult{Stdout: string(res.stdout), Stderr: string(res.stderr), ExitCode: res.exitCode}
	if res.err != nil {
		t.Errorf("RunOpencode: %v\nstderr (last lines):\n%s", res.err, tail(out.Stderr, 20))
	}
	return out
}
