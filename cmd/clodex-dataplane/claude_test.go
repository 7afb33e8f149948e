package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/clienttest"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// fakeClaude stands in for Claude Code where a test checks what the
// session does around it (environment, arguments, signals, exit status),
// which the real client does not report. It writes its arguments and
// environment next to $FAKE_CLAUDE_OUT, asks the data plane at
// $ANTHROPIC_BASE_URL for /healthz, then behaves as $FAKE_CLAUDE_MODE says.
const fakeClaude = `#!/bin/bash
out="$FAKE_CLAUDE_OUT"
printf '%s\n' "$@" >"$out.args"
env >"$out.env"
hp="${ANTHROPIC_BASE_URL#http://}"
if exec 3<>"/dev/tcp/${hp%:*}/${hp##*:}"; then
	printf 'GET /healthz HTTP/1.0\r\nHost: %s\r\n\r\n' "$hp" >&3
	cat <&3 >"$out.healthz"
	exec 3<&-
fi
case "$FAKE_CLAUDE_MODE" in
exit7) exit 7 ;;
signals)
	trap 'echo INT >>"$out.signals"' INT
	trap 'echo TERM >>"$out.signals"; trap - TERM; kill -TERM $$' TERM
	echo ready >"$out.ready"
	while :; do sleep 0.05; done ;;
esac
exit 0
`

func TestClaudeEnviron(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		want    []string
	}{
		{
			name:    "user's keys and providers removed, the rest kept",
			environ: []string{"PATH=/bin", "ANTHROPIC_API_KEY=sk-ant", "ANTHROPIC_AUTH_TOKEN=x", "ANTHROPIC_BASE_URL=https://api.anthropic.com", "CLAUDE_CODE_OAUTH_TOKEN=o", "CLAUDE_CODE_USE_BEDROCK=1", "CLAUDE_CODE_USE_VERTEX=1", "CLAUDE_CODE_USE_FOUNDRY=1", "ANTHROPIC_MODEL=opus"},
			want:    []string{"PATH=/bin", "ANTHROPIC_MODEL=opus", "ANTHROPIC_BASE_URL=http://127.0.0.1:9", "ANTHROPIC_AUTH_TOKEN=clodex-local", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"},
		},
		{
			name:    "the user's nonessential-traffic choice stands",
			environ: []string{"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=0"},
			want:    []string{"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=0", "ANTHROPIC_BASE_URL=http://127.0.0.1:9", "ANTHROPIC_AUTH_TOKEN=clodex-local"},
		},
		{
			name:    "empty counts as unset",
			environ: []string{"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="},
			want:    []string{"ANTHROPIC_BASE_URL=http://127.0.0.1:9", "ANTHROPIC_AUTH_TOKEN=clodex-local", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"},
		},
	}
	for _, tt := range tests {
		if got := claudeEnviron(tt.environ, "http://127.0.0.1:9", claudeToken); !slices.Equal(got, tt.want) {
			t.Errorf("%s: claudeEnviron(%q) = %q, want %q", tt.name, tt.environ, got, tt.want)
		}
	}
}

// claudeBins builds clodex-dataplane and clodex-sim into one folder, as
// make build does.
func claudeBins(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), ".", "../clodex-sim").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

// claudeCase is one session run in-process.
type claudeCase struct {
	t       *testing.T
	home    string // HOME: fresh, no Codex credentials
	state   string // XDG_STATE_HOME
	pathDir string // first PATH folder; holds the claude under test
	out     string // prefix of the fake claude's files
	env     map[string]string
	exe     string // the session's executable; clodex-sim is looked for beside it
	sigs    chan os.Signal
	stdout  syncBuffer
	stderr  syncBuffer
}

func newClaudeCase(t *testing.T, bins string) *claudeCase {
	t.Helper()
	c := &claudeCase{t: t, home: t.TempDir(), state: t.TempDir(), pathDir: t.TempDir(), sigs: make(chan os.Signal, 4)}
	c.out = filepath.Join(t.TempDir(), "claude")
	c.exe = filepath.Join(bins, "clodex-dataplane")
	c.env = map[string]string{
		"PATH":             c.pathDir + ":/usr/bin:/bin",
		"HOME":             c.home,
		"XDG_STATE_HOME":   c.state,
		"CLODEX_LISTEN":    freeAddr(t),
		"FAKE_CLAUDE_OUT":  c.out,
		"FAKE_CLAUDE_MODE": "exit7",
	}
	return c
}

// useFakeClaude puts fakeClaude on the case's PATH as claude.
func (c *claudeCase) useFakeClaude() {
	if err := os.WriteFile(filepath.Join(c.pathDir, "claude"), []byte(fakeClaude), 0o755); err != nil {
		c.t.Fatal(err)
	}
}

// run runs the session with args and returns its exit code and error.
func (c *claudeCase) run(ctx context.Context, args ...string) (int, error) {
	var environ []string
	for k, v := range c.env {
		environ = append(environ, k+"="+v)
	}
	return runClaude(ctx, args, claudeIO{
		lookupEnv:  envMap(c.env),
		environ:    environ,
		executable: c.exe,
		signals:    c.sigs,
		stdout:     &c.stdout,
		stderr:     &c.stderr,
	})
}

// fakeEnv is the environment the fake claude ran with.
func (c *claudeCase) fakeEnv() map[string]string {
	c.t.Helper()
	b, err := os.ReadFile(c.out + ".env")
	if err != nil {
		c.t.Fatalf("the fake claude did not run: %v", err)
	}
	env := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			env[k] = v
		}
	}
	return env
}

// listening reports whether something accepts connections on addr.
func listening(t *testing.T, addr string) bool {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func TestClaudeSession(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bins := claudeBins(t)

	// A fresh HOME with no Codex credentials: the session starts clodex-sim
	// and a data plane, Claude Code gets the documented environment and the
	// arguments unchanged, its exit status is the session's, and everything
	// started is gone afterwards.
	t.Run("starts a data plane in front of the emulator", func(t *testing.T) {
		c := newClaudeCase(t, bins)
		c.useFakeClaude()
		tmp := t.TempDir()
		t.Setenv("TMPDIR", tmp) // the emulator's scratch folder
		c.env["ANTHROPIC_API_KEY"] = "sk-ant-users-own-key"
		c.env["ANTHROPIC_AUTH_TOKEN"] = "users-other-token"
		c.env["ANTHROPIC_BASE_URL"] = "https://api.anthropic.com"
		c.env["CLAUDE_CODE_USE_BEDROCK"] = "1"
		c.env["KEEP_ME"] = "kept"
		args := []string{"--model", "claude-opus-4-1", "two words", "-p", ""}

		code, err := c.run(t.Context(), args...)
		if err != nil || code != 7 {
			t.Fatalf("session = %d, %v; want 7 (the fake claude's exit status), nil\nstderr:\n%s", code, err, c.stderr.String())
		}
		b, err := os.ReadFile(c.out + ".args")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"); !slices.Equal(got, args) {
			t.Errorf("claude got arguments %q, want %q", got, args)
		}
		env := c.fakeEnv()
		addr := c.env["CLODEX_LISTEN"]
		for k, want := range map[string]string{
			"ANTHROPIC_BASE_URL":                       "http://" + addr,
			"ANTHROPIC_AUTH_TOKEN":                     "clodex-local",
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
			"KEEP_ME": "kept",
			"HOME":    c.home,
		} {
			if env[k] != want {
				t.Errorf("claude's %s = %q, want %q", k, env[k], want)
			}
		}
		for _, k := range []string{"ANTHROPIC_API_KEY", "CLAUDE_CODE_USE_BEDROCK"} {
			if v, ok := env[k]; ok {
				t.Errorf("claude inherited %s=%q, want it removed", k, v)
			}
		}
		if b, err := os.ReadFile(c.out + ".healthz"); err != nil || !strings.Contains(string(b), `"service":"clodex-dataplane"`) {
			t.Errorf("while claude ran, GET /healthz on %s answered %q (%v), want the data plane", addr, b, err)
		}
		for _, want := range []string{
			"clodex: no Codex credentials at " + filepath.Join(c.home, ".codex", "auth.json") + "; started clodex-sim",
			"clodex: started a data plane on " + addr + " for this session (log: " + filepath.Join(c.state, "clodex", "claude", "dataplane.log") + ")",
		} {
			if !strings.Contains(c.stderr.String(), want) {
				t.Errorf("stderr does not say %q:\n%s", want, c.stderr.String())
			}
		}
		if c.stdout.String() != "" {
			t.Errorf("stdout = %q, want only what claude printed (nothing)", c.stdout.String())
		}

		// Afterwards: the data plane is down, the emulator's folder is
		// gone, nothing was written to HOME, the log is private.
		if listening(t, addr) {
			t.Errorf("something still listens on %s after the session", addr)
		}
		if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
			t.Errorf("the session left %v in TMPDIR", entries)
		}
		if entries, _ := os.ReadDir(c.home); len(entries) != 0 {
			t.Errorf("the session wrote %v into HOME, want nothing (no Claude Code settings)", entries)
		}
		fi, err := os.Stat(filepath.Join(c.state, "clodex", "claude", "dataplane.log"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("session log: %v, mode %v; want a 0600 file", err, fi.Mode().Perm())
		}
	})

	// A data plane already answers on the address: the session uses it,
	// starts nothing (there is no clodex-sim to start and no credentials),
	// and leaves it running.
	t.Run("uses the running data plane", func(t *testing.T) {
		s := startSim(t)
		r := startRun(t, nil, s.args()...)
		c := newClaudeCase(t, bins)
		c.useFakeClaude()
		c.exe = filepath.Join(t.TempDir(), "clodex-dataplane") // no clodex-sim beside it
		c.env["CLODEX_LISTEN"] = strings.TrimPrefix(r.base, "http://")
		c.env["FAKE_CLAUDE_MODE"] = ""
		code, err := c.run(t.Context())
		if err != nil || code != 0 {
			t.Fatalf("session = %d, %v; want 0, nil\nstderr:\n%s", code, err, c.stderr.String())
		}
		if want := "clodex: using the clodex data plane on " + c.env["CLODEX_LISTEN"] + "\n"; c.stderr.String() != want {
			t.Errorf("stderr = %q, want %q", c.stderr.String(), want)
		}
		if got := c.fakeEnv()["ANTHROPIC_BASE_URL"]; got != r.base {
			t.Errorf("claude's ANTHROPIC_BASE_URL = %q, want %q", got, r.base)
		}
		if got := turn(t, r.base, "#sim reply still up"); got != "still up" {
			t.Errorf("the running data plane after the session answered %q, want \"still up\"", got)
		}
	})

	// SIGTERM reaches Claude Code and its death by it is the session's
	// status (128+15); SIGINT is not passed on (the terminal already
	// delivered it to Claude Code, which shares the process group).
	t.Run("passes SIGTERM on, not SIGINT", func(t *testing.T) {
		c := newClaudeCase(t, bins)
		c.useFakeClaude()
		c.env["FAKE_CLAUDE_MODE"] = "signals"
		type result struct {
			code int
			err  error
		}
		done := make(chan result, 1)
		go func() {
			code, err := c.run(t.Context())
			done <- result{code, err}
		}()
		finished := false
		defer func() { // when the test stops early, end the session too
			if !finished {
				c.sigs <- syscall.SIGTERM
				<-done
			}
		}()
		waitFor(t, func() bool { _, err := os.Stat(c.out + ".ready"); return err == nil },
			func() string { return "the fake claude never got ready; stderr:\n" + c.stderr.String() })
		c.sigs <- syscall.SIGINT
		c.sigs <- syscall.SIGTERM
		res := <-done
		finished = true
		if res.err != nil || res.code != 128+int(syscall.SIGTERM) {
			t.Errorf("session = %d, %v; want %d (killed by SIGTERM), nil", res.code, res.err, 128+int(syscall.SIGTERM))
		}
		if b, _ := os.ReadFile(c.out + ".signals"); string(b) != "TERM\n" {
			t.Errorf("claude received %q, want only TERM", b)
		}
		if listening(t, c.env["CLODEX_LISTEN"]) {
			t.Errorf("the data plane still listens after the session")
		}
	})

	t.Run("refuses a listener that is not clodex", func(t *testing.T) {
		other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"ok":true}`))
		}))
		defer other.Close()
		c := newClaudeCase(t, bins)
		c.useFakeClaude()
		c.env["CLODEX_LISTEN"] = strings.TrimPrefix(other.URL, "http://")
		code, err := c.run(t.Context())
		want := c.env["CLODEX_LISTEN"] + ` is not a clodex data plane (GET /healthz answered 200 "{\"ok\":true}"); stop what listens there or set CLODEX_LISTEN to another loopback address`
		if code != 1 || err == nil || err.Error() != want {
			t.Errorf("session = %d, %v; want 1, %q", code, err, want)
		}
		if _, err := os.Stat(c.out + ".args"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("claude ran (stat %v), want it not started", err)
		}
	})

	t.Run("no claude on PATH", func(t *testing.T) {
		c := newClaudeCase(t, bins)
		code, err := c.run(t.Context())
		// The hint names the version the real-client tests pin.
		want := "claude (Claude Code) is not on PATH; install the version clodex is tested with: npm install -g @anthropic-ai/claude-code@" + clienttest.ClaudeCodeVersion
		if code != 1 || err == nil || err.Error() != want {
			t.Errorf("session = %d, %v; want 1, %q", code, err, want)
		}
		if listening(t, c.env["CLODEX_LISTEN"]) {
			t.Errorf("a data plane was started for a session that cannot run")
		}
	})

	t.Run("no emulator and no credentials", func(t *testing.T) {
		c := newClaudeCase(t, bins)
		c.useFakeClaude()
		c.exe = filepath.Join(t.TempDir(), "clodex-dataplane")
		code, err := c.run(t.Context())
		for _, want := range []string{"no Codex credentials at " + filepath.Join(c.home, ".codex", "auth.json"), "sign in with `codex login`",
			"clodex-sim is neither beside " + c.exe + " nor on PATH; build it with `make build`"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("session error = %v, want it to say %q", err, want)
			}
		}
		if code != 1 || listening(t, c.env["CLODEX_LISTEN"]) {
			t.Errorf("session = %d (listening %v), want 1 and nothing left listening", code, listening(t, c.env["CLODEX_LISTEN"]))
		}
	})

	t.Run("bad CLODEX_LISTEN", func(t *testing.T) {
		c := newClaudeCase(t, bins)
		c.useFakeClaude()
		c.env["CLODEX_LISTEN"] = "0.0.0.0:17645"
		code, err := c.run(t.Context())
		want := `CLODEX_LISTEN="0.0.0.0:17645": the session's data plane must listen on a loopback host:port, e.g. 127.0.0.1:17645 (any host:port with a member key)`
		if code != 1 || err == nil || err.Error() != want {
			t.Errorf("session = %d, %v; want 1, %q", code, err, want)
		}
	})

	// A member's session: the key (CLODEX_MEMBER_KEY_FILE, or
	// --member-key-file before Claude Code's arguments) is checked on the
	// team's data plane and sent as ANTHROPIC_AUTH_TOKEN; nothing is
	// started. A key the data plane refuses, or no data plane, stops the
	// session before Claude Code, saying why.
	t.Run("a member key", func(t *testing.T) {
		s := startSim(t)
		cp := controlplanetest.Start(t, nil)
		r := startRun(t, map[string]string{"CLODEX_MEMBER_KEYS": "1"}, append(s.args(), "--control-plane", cp.Addr, "--agent-token-file", cp.AgentTokenFile)...)
		key := "clx_the-key-of-alice"
		sum := sha256.Sum256([]byte(key))
		admin := controlplanev1.NewAdminServiceClient(cp.Dial(cp.AdminToken, nil))
		if _, err := admin.CreateMember(t.Context(), &controlplanev1.CreateMemberRequest{Name: "alice", KeySha256: sum[:]}); err != nil {
			t.Fatal(err)
		}
		keyFile := filepath.Join(t.TempDir(), "alice.key")
		if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		addr := strings.TrimPrefix(r.base, "http://")
		for _, how := range []string{"env", "flag"} {
			c := newClaudeCase(t, bins)
			c.useFakeClaude()
			c.env["CLODEX_LISTEN"], c.env["FAKE_CLAUDE_MODE"] = addr, ""
			args := []string{"-p", "hi"}
			if how == "env" {
				c.env["CLODEX_MEMBER_KEY_FILE"] = keyFile
			} else {
				args = append([]string{"--member-key-file", keyFile}, args...)
			}
			for i := 0; modelsWith(t, r.base, key) != http.StatusOK; i++ { // the member list reaches the data plane on its agent stream
				if i == 1000 {
					t.Fatal("the data plane never served alice's key")
				}
				time.Sleep(10 * time.Millisecond)
			}
			code, err := c.run(t.Context(), args...)
			if err != nil || code != 0 {
				t.Fatalf("%s: session = %d, %v; want 0\nstderr:\n%s", how, code, err, c.stderr.String())
			}
			if env := c.fakeEnv(); env["ANTHROPIC_AUTH_TOKEN"] != key || env["ANTHROPIC_BASE_URL"] != r.base {
				t.Errorf("%s: claude got ANTHROPIC_AUTH_TOKEN %q, ANTHROPIC_BASE_URL %q; want the member key and %s", how, env["ANTHROPIC_AUTH_TOKEN"], env["ANTHROPIC_BASE_URL"], r.base)
			}
			b, _ := os.ReadFile(c.out + ".args")
			if got := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Equal(got, []string{"-p", "hi"}) {
				t.Errorf("%s: claude got arguments %q, want -p hi", how, got)
			}
			if want := "clodex: using the team's data plane on " + addr + " with your member key\n"; c.stderr.String() != want {
				t.Errorf("%s: stderr = %q, want %q", how, c.stderr.String(), want)
			}
		}

		wrong := filepath.Join(t.TempDir(), "wrong.key")
		if err := os.WriteFile(wrong, []byte("clx_not-a-member\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c := newClaudeCase(t, bins)
		c.useFakeClaude()
		c.env["CLODEX_LISTEN"], c.env["CLODEX_MEMBER_KEY_FILE"] = addr, wrong
		code, err := c.run(t.Context())
		if code != 1 || err == nil || !strings.Contains(err.Error(), "the data plane on "+addr+" refuses the member key (401: invalid member key") ||
			strings.Contains(err.Error(), "not-a-member") {
			t.Errorf("a key the data plane refuses: %d, %v; want 1 saying so, without the key", code, err)
		}
		c.env["CLODEX_LISTEN"] = freeAddr(t)
		code, err = c.run(t.Context())
		if code != 1 || err == nil || !strings.Contains(err.Error(), "no clodex data plane answers on "+c.env["CLODEX_LISTEN"]+": a member key is for the team's data plane") {
			t.Errorf("a member key and no data plane: %d, %v; want 1 saying so", code, err)
		}
		if _, err := os.Stat(c.out + ".args"); !errors.Is(err, os.ErrNotExist) || listening(t, c.env["CLODEX_LISTEN"]) {
			t.Errorf("claude ran (stat %v) or a data plane was started; want neither", err)
		}
	})

	// The real Claude Code, non-interactively, through a session's own data
	// plane and emulator: the arguments reach it and its answer is the
	// emulator's.
	t.Run("real Claude Code -p", func(t *testing.T) {
		bin := clienttest.ClaudeCode(t)
		c := newClaudeCase(t, bins)
		if err := os.Symlink(bin, filepath.Join(c.pathDir, "claude")); err != nil {
			t.Fatal(err)
		}
		c.env["TERM"] = "dumb"
		c.env["DISABLE_AUTOUPDATER"] = "1"
		unlock := clienttest.LockClientRun(t.Context(), t)
		defer unlock()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() { // a bound, not an assertion: a hung client is stopped
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Minute):
				c.sigs <- syscall.SIGTERM
			}
		}()
		code, err := c.run(ctx, "-p", "#sim reply through clodex-dataplane claude", "--output-format", "json", "--no-session-persistence")
		cancel()
		if err != nil || code != 0 {
			t.Fatalf("session = %d, %v; want 0, nil\nstdout:\n%s\nstderr:\n%s", code, err, c.stdout.String(), c.stderr.String())
		}
		var res struct {
			Result  string `json:"result"`
			IsError bool   `json:"is_error"`
		}
		if err := json.Unmarshal([]byte(c.stdout.String()), &res); err != nil || res.IsError || res.Result != "through clodex-dataplane claude" {
			t.Errorf("claude -p printed %q (%v), want the result \"through clodex-dataplane claude\"", c.stdout.String(), err)
		}
	})
}

// The pinned Claude Code TUI from a fresh HOME, in a tmux pane:
// `clodex-dataplane claude` starts the emulator and a data plane, Claude
// Code shows only its local first-start screens (no connectivity check, no
// API-key question), answers a prompt with the emulator's reply, and /exit
// ends the session with status 0 and the data plane stopped.
func TestClaudeInteractive(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and drives Claude Code in tmux")
	}
	tmux := clienttest.Tool(t, "tmux", "apt-get install tmux (scripts/install-clients.sh does it when run as root)")
	claude := clienttest.ClaudeCode(t)
	bins := claudeBins(t)

	dir := t.TempDir()
	home, work, pathDir := filepath.Join(dir, "home"), filepath.Join(dir, "work"), filepath.Join(dir, "path")
	for _, d := range []string{home, work, pathDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(claude, filepath.Join(pathDir, "claude")); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	sock := filepath.Join(dir, "tmux.sock")
	tm := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(tmux, append([]string{"-S", sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	unlock := clienttest.LockClientRun(t.Context(), t)
	defer unlock()
	// The pane's shell prints the session's exit status when it ends.
	session := "env -i PATH=" + pathDir + ":" + bins + ":/usr/bin:/bin HOME=" + home + " TERM=xterm-256color" +
		" XDG_STATE_HOME=" + filepath.Join(dir, "state") + " CLODEX_LISTEN=" + addr +
		` clodex-dataplane claude; echo "clodex-exit=$?"; sleep 600`
	tm("new-session", "-d", "-s", "claude", "-x", "120", "-y", "40", "-c", work, "--", "sh", "-c", session)
	defer func() { // the pane's `sleep 600` keeps the server up until now
		if out, err := exec.Command(tmux, "-S", sock, "kill-server").CombinedOutput(); err != nil {
			t.Errorf("tmux kill-server: %v\n%s", err, out)
		}
	}()

	visible := func() string { return tm("capture-pane", "-p", "-t", "claude") }
	screen := func() string { return tm("capture-pane", "-p", "-t", "claude", "-S", "-200") }
	logs := func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "state", "clodex", "claude", "dataplane.log"))
		return fmt.Sprintf("screen:\n%s\ndata plane log:\n%s", screen(), b)
	}
	keys := func(k ...string) { tm(append([]string{"send-keys", "-t", "claude"}, k...)...) }
	// Waits below are bounds on how long to wait for the TUI, not
	// assertions about speed.
	waitScreen := func(what string, ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			sc := screen()
			if ok(sc) {
				return sc
			}
			if time.Now().After(deadline) {
				t.Fatalf("the pane never showed %s\n%s", what, logs())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	shows := func(s string) func(string) bool { return func(sc string) bool { return strings.Contains(sc, s) } }
	// settled returns the visible screen once it has not changed for a
	// second: a key sent earlier may be dropped while the TUI draws.
	settled := func() string {
		t.Helper()
		prev, since := visible(), time.Now()
		for time.Since(since) < time.Second {
			time.Sleep(100 * time.Millisecond)
			if v := visible(); v != prev {
				prev, since = v, time.Now()
			}
		}
		return prev
	}

	// Claude Code's first start: text style, security notes, folder trust,
	// then the prompt. Each settled screen gets one key; a screen that does
	// not change within 15 s gets it again (it was dropped). The trust
	// list wraps around, so Down is only sent while "No" is selected.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		v := settled()
		// Neither the onboarding's connectivity check nor the custom key
		// question may appear: the session avoids both.
		for _, bad := range []string{"Unable to connect to Anthropic services", "Detected a custom API key"} {
			if strings.Contains(screen(), bad) {
				t.Fatalf("the pane showed %q\n%s", bad, logs())
			}
		}
		if strings.Contains(v, "clodex-exit=") {
			t.Fatalf("clodex-dataplane claude ended during Claude Code's first start\n%s", logs())
		}
		if strings.Contains(v, "shift+tab to cycle") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Claude Code's first start did not reach the prompt\n%s", logs())
		}
		switch {
		case strings.Contains(v, "Choose the text style"), strings.Contains(v, "Press Enter to continue"):
			keys("Enter")
		case strings.Contains(v, "Yes, I trust this folder"):
			yes := slices.ContainsFunc(strings.Split(v, "\n"), func(l string) bool {
				return strings.Contains(l, "❯") && strings.Contains(l, "Yes, I trust this folder")
			})
			if yes {
				keys("Enter")
			} else {
				keys("Down")
			}
		default:
			continue // something else is being drawn; look again
		}
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end) && visible() == v; {
			time.Sleep(100 * time.Millisecond)
		}
	}

	const prompt = "say hello to clodex"
	keys("-l", prompt)
	waitScreen("the typed prompt", shows(prompt))
	keys("Enter")
	waitScreen("the emulator's reply", shows("Hello from clodex-sim. You said:"))
	settled()
	keys("-l", "/exit")
	waitScreen("the typed /exit", shows("/exit"))
	keys("Enter")
	sc := waitScreen("the session's exit status", shows("clodex-exit="))
	if !strings.Contains(sc, "clodex-exit=0") {
		t.Errorf("clodex-dataplane claude did not exit 0\n%s", logs())
	}
	sc = strings.Join(strings.Fields(sc), " ") // undo the pane's line wrapping
	for _, want := range []string{"started clodex-sim", "clodex: started a data plane on " + addr} {
		if !strings.Contains(sc, want) {
			t.Errorf("the pane does not show %q\n%s", want, logs())
		}
	}
	if listening(t, addr) {
		t.Errorf("the session's data plane still listens on %s after Claude Code exited", addr)
	}
	// The log holds the one turn Claude Code sent.
	f, err := os.Open(filepath.Join(dir, "state", "clodex", "claude", "dataplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	turns := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if strings.Contains(sc.Text(), "path=/v1/messages status=200") {
			turns++
		}
	}
	if turns != 1 {
		t.Errorf("the data plane served %d turns, want 1\n%s", turns, logs())
	}
}
