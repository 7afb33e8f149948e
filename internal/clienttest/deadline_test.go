package clienttest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/filelock"
)

// said collects the lines a wait announces.
type said struct {
	mu    sync.Mutex
	lines []string
}

func (s *said) say(msg string) {
	s.mu.Lock()
	s.lines = append(s.lines, msg)
	s.mu.Unlock()
}

func (s *said) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

// A lock wait says, as it starts, who holds the lock (pid and what, from
// the holder file) and for how long it will wait; at the deadline it fails
// naming the lock, the limit, the holder and what to do.
func TestLockWaitSaysWhatItWaitsFor(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".install.lock")
	var first said
	release, err := waitLock(t.Context(), path, "installing Fake Client 9.9.9", time.Second, first.say)
	if err != nil {
		t.Fatal(err)
	}
	if first.String() != "" {
		t.Errorf("a free lock announced %q; want nothing", first.String())
	}
	var second said
	_, err = waitLock(t.Context(), path, "installing Other 1.0", 300*time.Millisecond, second.say)
	pid := fmt.Sprint(os.Getpid())
	if !errors.Is(err, errDeadline) {
		t.Fatalf("waitLock on a held lock = %v; want the deadline", err)
	}
	for _, want := range []string{path, "waited 300ms (the limit)", "still held by pid " + pid + " (installing Fake Client 9.9.9, since ",
		"fix: let that process finish, or end it if it hung (kill " + pid + "), then run the tests again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if got, want := second.String(), "waiting up to 300ms for "+path+", held by pid "+pid+" (installing Fake Client 9.9.9, since "; !strings.HasPrefix(got, want) {
		t.Errorf("the wait announced %q; want it to start %q", got, want)
	}

	// Released: the next one takes it at once, and names itself.
	release()
	var third said
	release, err = waitLock(t.Context(), path, "installing Other 1.0", time.Second, third.say)
	if err != nil || third.String() != "" {
		t.Fatalf("waitLock after the release = %v, said %q; want the lock at once", err, third.String())
	}
	if h := readHolder(path); h.pid != os.Getpid() || h.what != "installing Other 1.0" || !h.alive {
		t.Errorf("holder %+v; want this process installing Other 1.0", h)
	}
	release()
	if _, err := os.Stat(path + holderSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("holder file after the release: %v; want it removed", err)
	}
}

// A holder that left no file, or a file naming a process that is gone, is
// described as such.
func TestLockWaitUnknownOrStaleHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".run.lock")
	l, err := filelock.Acquire(t.Context(), path) // a holder that writes no holder file
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var s said
	_, err = waitLock(t.Context(), path, "running a client", 200*time.Millisecond, s.say)
	if want := "held by another process (it left no holder file naming itself)"; !strings.Contains(s.String(), want) || !strings.Contains(fmt.Sprint(err), want) {
		t.Errorf("said %q, error %v; want both to say %q", s.String(), err, want)
	}

	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("%d\ninstalling Codex CLI 0.171.0\n%d\n", gone.Process.Pid, time.Now().Unix())
	if err := os.WriteFile(path+holderSuffix, []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = waitLock(t.Context(), path, "running a client", 200*time.Millisecond, s.say)
	want := fmt.Sprintf("the holder file names pid %d, installing Codex CLI 0.171.0, which no longer runs", gone.Process.Pid)
	if !strings.Contains(fmt.Sprint(err), want) || strings.Contains(fmt.Sprint(err), "(kill ") {
		t.Errorf("error %v; want it to say %q and suggest no kill", err, want)
	}
}

// fakeSlowNPM answers `npm view` at once and never finishes an install.
const fakeSlowNPM = `#!/bin/sh
case "$1" in
view) echo "$FAKE_VERSION" ;;
install) exec sleep 60 ;;
esac
`

// An npm install that does not finish fails at its deadline, named, after
// a line that said it started and how long it may take; nothing is left
// in the cache.
func TestInstallHasADeadline(t *testing.T) {
	dir := t.TempDir()
	npm := filepath.Join(dir, "npm")
	if err := os.WriteFile(npm, []byte(fakeSlowNPM), 0o755); err != nil {
		t.Fatal(err)
	}
	var s said
	in := installer{cache: filepath.Join(dir, "cache"), npm: npm, installTimeout: 500 * time.Millisecond, say: s.say,
		env: []string{"PATH=" + os.Getenv("PATH"), "FAKE_VERSION=" + fakeClient.version}}
	_, err := in.install(t.Context(), fakeClient)
	if !errors.Is(err, errDeadline) || !strings.Contains(err.Error(), "npm install @fake/pkg@9.9.9: deadline reached: no result within 500ms (the install's limit)") {
		t.Fatalf("install() = %v; want the install deadline named", err)
	}
	if want := "installing Fake Client 9.9.9 (npm @fake/pkg@9.9.9) into " + in.dir(fakeClient) + ": up to 500ms"; !strings.HasPrefix(s.String(), want) {
		t.Errorf("said %q; want it to start %q", s.String(), want)
	}
	if left, _ := filepath.Glob(filepath.Join(in.cache, ".tmp-*")); len(left) != 0 {
		t.Errorf("left %v in the cache", left)
	}
	if msg := unavailableMessage(fakeClient, in.cache, err); !strings.Contains(msg, "fix: see what it waited for above") {
		t.Errorf("the test's failure %q lacks its fix", msg)
	}
}

// An install waiting for another process's install says so and fails at
// its deadline naming the holder.
func TestInstallWaitsForTheLockWithADeadline(t *testing.T) {
	f := newFakeInstaller(t, "")
	if err := os.MkdirAll(f.in.cache, 0o755); err != nil {
		t.Fatal(err)
	}
	release, err := waitLock(t.Context(), filepath.Join(f.in.cache, ".install.lock"), "installing Codex CLI 0.171.0", time.Second, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	var s said
	f.in.lockTimeout, f.in.say = 300*time.Millisecond, s.say
	_, err = f.in.install(t.Context(), fakeClient)
	if !errors.Is(err, errDeadline) || !strings.Contains(err.Error(), "still held by pid "+fmt.Sprint(os.Getpid())+" (installing Codex CLI 0.171.0") {
		t.Fatalf("install() = %v; want the lock's deadline naming its holder", err)
	}
	if !strings.Contains(s.String(), "waiting up to 300ms for "+filepath.Join(f.in.cache, ".install.lock")) {
		t.Errorf("said %q; want the wait announced", s.String())
	}
	if n := f.calls(t, "install"); n != 0 {
		t.Errorf("npm install ran %d times; want none without the lock", n)
	}
}

// scripts/install-clients.sh says whom it waits for and gives up at its
// deadline (CLODEX_INSTALL_LOCK_TIMEOUT), exit 1, naming what to do.
func TestInstallScriptLockDeadline(t *testing.T) {
	realNPM(t)
	cache := filepath.Join(t.TempDir(), "cache")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	release, err := waitLock(t.Context(), filepath.Join(cache, ".install.lock"), "installing Claude Code 2.1.332", time.Second, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	cmd := exec.CommandContext(t.Context(), "bash", scriptPath(t))
	cmd.Env = append(unreachableRegistryEnv(t), "CLODEX_CLIENT_CACHE="+cache, "CLODEX_INSTALL_LOCK_TIMEOUT=1")
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("install-clients.sh exit %d, want 1; output:\n%s", code, out)
	}
	pid := fmt.Sprint(os.Getpid())
	for _, want := range []string{
		"install-clients: waiting up to 1 s for " + cache + "/.install.lock, held by pid " + pid + " (installing Claude Code 2.1.332, since ",
		"install-clients: gave up after 1 s (CLODEX_INSTALL_LOCK_TIMEOUT) waiting for " + cache + "/.install.lock, still held by pid " + pid,
		"fix: let that process finish, or end it if it hung, then rerun scripts/install-clients.sh",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if h := readHolder(filepath.Join(cache, ".install.lock")); h.pid != os.Getpid() {
		t.Errorf("the script changed the holder file of a lock it never took: %+v", h)
	}

	cmd = exec.CommandContext(t.Context(), "bash", scriptPath(t))
	cmd.Env = append(unreachableRegistryEnv(t), "CLODEX_CLIENT_CACHE="+cache, "CLODEX_INSTALL_LOCK_TIMEOUT=soon")
	out, _ = cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), "CLODEX_INSTALL_LOCK_TIMEOUT=soon is not a positive whole number of seconds; want e.g. 1020") {
		t.Errorf("a bad CLODEX_INSTALL_LOCK_TIMEOUT: exit %d, output %s; want 2 naming it", code, out)
	}
}

// scripts/install-clients.sh announces each npm install with its limit and
// gives up at CLODEX_INSTALL_TIMEOUT, exit 1, naming it.
func TestInstallScriptInstallDeadline(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "npm"), []byte(fakeSlowNPM), 0o755); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	cmd := exec.CommandContext(t.Context(), "bash", scriptPath(t))
	cmd.Env = []string{"PATH=" + dir + ":" + os.Getenv("PATH"), "HOME=" + dir, "FAKE_VERSION=" + ClaudeCodeVersion,
		"CLODEX_CLIENT_CACHE=" + cache, "CLODEX_INSTALL_TIMEOUT=1"}
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("install-clients.sh exit %d, want 1; output:\n%s", code, out)
	}
	for _, want := range []string{
		"install-clients: installing @anthropic-ai/claude-code@" + ClaudeCodeVersion + " into " + cache + "/claude-code-" + ClaudeCodeVersion + ": up to 1 s",
		"install-clients: npm install @anthropic-ai/claude-code@" + ClaudeCodeVersion + " gave no result within 1 s (CLODEX_INSTALL_TIMEOUT)",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(cache, ".tmp-*")); len(left) != 0 {
		t.Errorf("left %v in the cache", left)
	}
	if _, err := os.Stat(filepath.Join(cache, ".install.lock"+holderSuffix)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("holder file after the script ended: %v; want it removed", err)
	}
}
