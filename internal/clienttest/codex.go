package clienttest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// CodexRun describes one non-interactive Codex CLI run (`codex exec`) against
// a Responses API server, with a custom model provider in API-key mode.
type CodexRun struct {
	// BaseURL is the provider's base_url, e.g. "http://127.0.0.1:PORT/v1";
	// Codex appends "/responses". It must point at a loopback address.
	BaseURL string
	// APIKey is sent as "Authorization: Bearer <APIKey>" (through the
	// provider's env_key); "sk-test" when empty.
	APIKey string
	// Model is the model slug; "gpt-5.5" (a catalog slug, so Codex offers its
	// exec_command tool) when empty.
	Model string
	// Prompt is the user prompt; required.
	Prompt string
	// WorkDir is the working directory; a fresh temporary folder when empty.
	WorkDir string
	// HTTP makes Codex use HTTP POST + SSE; by default the provider has
	// supports_websockets = true and Codex speaks WebSocket.
	HTTP bool
	// ExtraArgs go before the prompt, e.g. "-c", "model_reasoning_effort=\"low\"".
	ExtraArgs []string
	// ExtraEnv entries ("KEY=value") are added last and override the defaults.
	ExtraEnv []string
	// Timeout bounds the run; DefaultRunTimeout when zero.
	Timeout time.Duration
}

// CodexResult is what a Codex CLI run printed.
type CodexResult struct {
	// Events are the JSONL events of `codex exec --json`, in order
	// (thread.started, turn.started, item.started, item.completed,
	// turn.completed or turn.failed, error).
	Events []map[string]any
	// Stderr is everything Codex wrote to stderr.
	Stderr string
	// ExitCode is the exit status; -1 when the run was stopped at its timeout.
	ExitCode int
	// CodexHome is the CODEX_HOME the run used (config.toml lives there).
	CodexHome string
}

// Items returns the "item" objects of the item.completed events whose item
// type is typ (e.g. "agent_message", "command_execution"), in order.
func (r CodexResult) Items(typ string) []map[string]any {
	var items []map[string]any
	for _, ev := range r.Events {
		if ev["type"] != "item.completed" {
			continue
		}
		if it, ok := ev["item"].(map[string]any); ok && it["type"] == typ {
			items = append(items, it)
		}
	}
	return items
}

// AgentMessages returns the texts of the completed agent_message items.
func (r CodexResult) AgentMessages() []string {
	var texts []string
	for _, it := range r.Items("agent_message") {
		s, _ := it["text"].(string)
		texts = append(texts, s)
	}
	return texts
}

// codexProvider is the id of the custom provider RunCodex configures.
const codexProvider = "clodextest"

// codexKeyEnv is the env_key of that provider.
const codexKeyEnv = "CLODEXTEST_API_KEY"

// codexConfig renders the config.toml RunCodex writes. Besides the provider
// it turns off everything that would talk to a host other than BaseURL
// (update check, analytics, feedback, telemetry export, plugins and apps,
// which look up github.com and chatgpt.com), runs tools without asking
// (approval_policy "never") in the read-only sandbox, and disables retries so
// that one failure shows as one failure.
func codexConfig(r CodexRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "model = %s\n", tomlString(r.Model))
	fmt.Fprintf(&b, "model_provider = %s\n", tomlString(codexProvider))
	b.WriteString(`approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[features]
plugins = false
remote_plugin = false
apps = false

`)
	fmt.Fprintf(&b, "[model_providers.%s]\n", codexProvider)
	fmt.Fprintf(&b, "name = %s\n", tomlString(codexProvider))
	fmt.Fprintf(&b, "base_url = %s\n", tomlString(r.BaseURL))
	b.WriteString("wire_api = \"responses\"\n")
	fmt.Fprintf(&b, "env_key = %s\n", tomlString(codexKeyEnv))
	fmt.Fprintf(&b, "supports_websockets = %t\n", !r.HTTP)
	b.WriteString("request_max_retries = 0\nstream_max_retries = 0\n")
	b.WriteString("websocket_connect_timeout_ms = 15000\nstream_idle_timeout_ms = 60000\n")
	return b.String()
}

// tomlString quotes s as a TOML basic string (JSON string escapes are valid
// TOML escapes).
func tomlString(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSpace(buf.String())
}

// RunCodex runs Codex CLI (bin, from [CodexCLI]) once:
//
//	codex exec --strict-config --skip-git-repo-check --ephemeral --json
//	           --color never [EXTRA ARGS] -- PROMPT
//
// with stdin from /dev/null, a fresh CODEX_HOME holding the config.toml of
// codexConfig, and an environment built from scratch: PATH, a fresh HOME,
// CODEX_HOME, TERM=dumb, NO_COLOR=1, CLODEXTEST_API_KEY, then r.ExtraEnv. It
// holds the machine-wide client run lock while Codex runs. Bad input fails t;
// a run stopped at its timeout is reported with t.Errorf and ExitCode -1. A
// non-zero exit is not a test failure: assert on ExitCode and Events.
func RunCodex(ctx context.Context, t testing.TB, bin string, r CodexRun) CodexResult {
	t.Helper()
	if r.Prompt == "" {
		t.Fatal("RunCodex: Prompt is empty; codex exec needs a prompt")
	}
	if err := checkLoopback(r.BaseURL); err != nil {
		t.Fatalf("RunCodex: %v", err)
	}
	if r.APIKey == "" {
		r.APIKey = "sk-test"
	}
	if r.Model == "" {
		r.Model = "gpt-5.5"
	}
	if r.WorkDir == "" {
		r.WorkDir = t.TempDir()
	}
	if r.Timeout <= 0 {
		r.Timeout = DefaultRunTimeout
	}
	codexHome := t.TempDir()
	if err := os.WriteFile(filepath.Join(codexHome, "config.toml"), []byte(codexConfig(r)), 0o600); err != nil {
		t.Fatalf("RunCodex: write config.toml: %v", err)
	}
	env := append(baseEnv(t.TempDir()),
		"CODEX_HOME="+codexHome,
		codexKeyEnv+"="+r.APIKey,
	)
	env = append(env, r.ExtraEnv...)
	args := []string{"exec", "--strict-config", "--skip-git-repo-check", "--ephemeral", "--json", "--color", "never"}
	args = append(args, r.ExtraArgs...)
	args = append(args, "--", r.Prompt)

	unlock := LockClientRun(ctx, t)
	res := process{bin: bin, args: args, env: env, dir: r.WorkDir, timeout: r.Timeout}.run(ctx)
	unlock()

	out := CodexResult{Stderr: string(res.stderr), ExitCode: res.exitCode, CodexHome: codexHome}
	var other []string
	out.Events, other = jsonLines(res.stdout)
	for _, l := range other {
		t.Logf("codex: non-JSON stdout line: %s", l)
	}
	if res.err != nil {
		t.Errorf("RunCodex: %v\nstderr (last lines):\n%s", res.err, tail(out.Stderr, 20))
	}
	return out
}
