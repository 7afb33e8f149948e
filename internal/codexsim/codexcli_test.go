package codexsim_test

import (
	"bytes"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/clodex/clodex/internal/clienttest"
	"github.com/clodex/clodex/internal/codexsim"
)

// lockedBuffer is an io.Writer safe for the emulator's concurrent logging.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestCodexCLIConformance drives the real Codex CLI (npm @openai/codex
// 0.171.0, installed into the client cache outside the repository) against
// clodex-sim over WebSocket in API-key mode. The prompt makes the scripted
// model call exec_command; Codex runs the command and sends its
// function_call_output on the same socket, continuing the previous response,
// and the emulator's answer to that is Codex's final message.
//
// It skips only when the client is not cached, the npm registry cannot be
// reached and CI=true is not set (clienttest's rule; under CI it fails).
func TestCodexCLIConformance(t *testing.T) {
	bin := clienttest.CodexCLI(t)

	var simLog lockedBuffer
	srv, err := codexsim.New(codexsim.Config{
		AcceptTokens: map[string]string{"sk-test": "acct-test"},
		Logger:       slog.New(slog.NewTextHandler(&simLog, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("codexsim.New() error = %v", err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	defer srv.Close() // before ts.Close: ends the sockets httptest does not track

	res := clienttest.RunCodex(t.Context(), t, bin, clienttest.CodexRun{
		BaseURL: ts.URL + "/v1",
		APIKey:  "sk-test",
		Model:   "gpt-5.5", // a catalog model: Codex offers it the exec_command tool
		Prompt:  "Run the greeting command.\n" + `#sim call exec_command {"cmd":"echo hello-from-codex-tool"}`,
	})
	st := srv.Stats()
	if t.Failed() || res.ExitCode != 0 {
		t.Fatalf("codex exec exit code %d, want 0\nevents: %v\nstderr:\n%s\nemulator stats: %+v\nemulator log:\n%s",
			res.ExitCode, res.Events, res.Stderr, st, simLog.String())
	}

	// Codex ran the command the emulator asked for.
	cmds := res.Items("command_execution")
	if len(cmds) != 1 {
		t.Fatalf("completed command_execution items = %d, want 1; events: %v", len(cmds), res.Events)
	}
	if cmd, _ := cmds[0]["command"].(string); !strings.Contains(cmd, "echo hello-from-codex-tool") {
		t.Errorf("command = %q, want it to run echo hello-from-codex-tool", cmd)
	}
	if out, _ := cmds[0]["aggregated_output"].(string); out != "hello-from-codex-tool\n" {
		t.Errorf("command output = %q, want %q", out, "hello-from-codex-tool\n")
	}
	if code, _ := cmds[0]["exit_code"].(float64); code != 0 {
		t.Errorf("command exit code = %v, want 0", cmds[0]["exit_code"])
	}

	// The final answer is the emulator's reply to the function_call_output.
	msgs := res.AgentMessages()
	if len(msgs) != 1 {
		t.Fatalf("agent messages = %q, want exactly one", msgs)
	}
	t.Logf("final message: %q", msgs[0])
	// Codex 0.171.0's exec_command output starts with "Chunk ID: ".
	const replyPrefix = "Tool result received: Chunk ID: "
	if !strings.HasPrefix(msgs[0], replyPrefix) {
		t.Errorf("final message = %q, want the emulator's reply to the tool output, starting %q", msgs[0], replyPrefix)
	}
	if last := res.Events[len(res.Events)-1]; last["type"] != "turn.completed" {
		t.Errorf("last event = %v, want turn.completed", last)
	}

	// Everything went over one socket: prewarm (generate:false), the turn
	// continuing the prewarm, and the function_call_output continuing the
	// turn, both with a previous_response_id the emulator found.
	checks := []struct {
		name      string
		got, want int64
	}{
		{"upgrades", st.Upgrades, 1},
		{"prewarms", st.Prewarms, 1},
		{"responses", st.Responses, 3},
		{"continued_responses", st.ContinuedResponses, 2},
		{"completed_responses", st.CompletedResponses, 3},
		{"previous_response_not_found", st.PreviousResponseNotFound, 0},
		{"upgrade_401s", st.Upgrade401s, 0},
		{"upgrade_400s", st.Upgrade400s, 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("emulator stats %s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if got := st.UpgradesByAccount["acct-test"]; got != 1 {
		t.Errorf("emulator stats upgrades_by_account[acct-test] = %d, want 1", got)
	}
	if len(st.Errors) != 0 {
		t.Errorf("emulator stats errors = %v, want none", st.Errors)
	}
	if t.Failed() {
		t.Logf("emulator stats: %+v\nemulator log:\n%s\ncodex stderr:\n%s", st, simLog.String(), res.Stderr)
	}
}
