package refresh

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// buildBinaries builds clodex-sim and clodex-dataplane into a test
// directory with one go build (the build cache makes repeats fast).
func buildBinaries(ctx context.Context, t *testing.T) (sim, dataplane string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	goBin, err := exec.LookPath("go") // go test puts the go command that runs it first on PATH
	if err != nil {
		t.Fatalf("find the go command: %v", err)
	}
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", dir+string(os.PathSeparator), "./cmd/clodex-sim", "./cmd/clodex-dataplane")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/clodex-sim ./cmd/clodex-dataplane: %v\n%s", err, out)
	}
	return filepath.Join(dir, "clodex-sim"), filepath.Join(dir, "clodex-dataplane")
}

// proc is one child process in its own process group, logging stdout and
// stderr to one file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when Wait returned
	waitErr error         // set before done is closed
}

// startProc starts path with args and exactly env in a new process group
// (killed with this process), and waits until a stdout line matches ready;
// it returns the first submatch. The process is stopped at t's cleanup:
// SIGTERM to the group, then SIGKILL after a grace period.
func startProc(t *testing.T, name, path string, args, env []string, ready *regexp.Regexp) (*proc, string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatalf("start %s: open log: %v", name, err)
	}
	found := make(chan string, 1)
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdout = &lineWatcher{w: logf, re: ready, found: found}
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 2 * time.Second // a grandchild holding the pipe cannot hang Wait
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() { // owned by p: ends when the process does
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(10 * time.Second)
		if t.Failed() {
			t.Logf("%s log (%s):\n%s", name, logPath, p.tail(40))
		}
	})
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case v := <-found:
		return p, v
	case <-p.done:
		t.Fatalf("start %s: exited before it was ready (%v); log:\n%s", name, p.waitErr, p.tail(40))
	case <-timer.C:
		t.Fatalf("start %s: not ready after 30s; log:\n%s", name, p.tail(40))
	}
	return nil, ""
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, waits up to grace, then sends
// SIGKILL and waits.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// log returns the whole log so far.
func (p *proc) log() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(read %s: %v)", p.logPath, err)
	}
	return string(b)
}

// tail returns the last n lines of the log.
func (p *proc) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// lineWatcher copies everything to w and sends the first submatch of re
// found in a complete line on found (buffered, once).
type lineWatcher struct {
	w     *os.File
	re    *regexp.Regexp
	found chan<- string

	mu   sync.Mutex // guards buf and sent
	buf  []byte
	sent bool
}

func (l *lineWatcher) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sent {
		return n, err
	}
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		line := l.buf[:i]
		l.buf = l.buf[i+1:]
		if m := l.re.FindSubmatch(line); m != nil {
			v := string(m[0])
			if len(m) > 1 {
				v = string(m[1])
			}
			l.found <- v
			l.sent, l.buf = true, nil
			break
		}
	}
	if len(l.buf) > 64<<10 { // a line that long is not the ready line
		l.buf = nil
	}
	return n, err
}
