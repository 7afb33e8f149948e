package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// proc is one child process in its own process group. Its stdout and
// stderr go to one log file; the first stdout line matching the ready
// pattern is handed to start's caller.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when Wait returned
	waitErr error         // set before done is closed
}

// lineWatcher copies everything to w and sends the first submatch of re
// found in a complete line on found (once).
type lineWatcher struct {
	w     io.Writer
	re    *regexp.Regexp
	found chan<- string
	mu    sync.Mutex
	buf   []byte
	sent  bool
}

func (l *lineWatcher) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sent || l.re == nil {
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
			l.found <- v // buffered 1, sent once
			l.sent = true
			l.buf = nil
			break
		}
	}
	if len(l.buf) > 64<<10 { // a line that long is not the ready line
		l.buf = nil
	}
	return n, err
}

// startProc starts path with args and env (the whole environment: nothing
// is inherited) in a new process group, logging to logPath. With ready
// non-nil it waits until a stdout line matches (returning the first
// submatch, or the whole match) or the process exits or readyTimeout
// passes; a failure kills the process group and names the log.
func startProc(ctx context.Context, name, path string, args, env []string, logPath string, ready *regexp.Regexp, readyTimeout time.Duration) (*proc, string, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("start %s: open log: %w", name, err)
	}
	found := make(chan string, 1)
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdout = &lineWatcher{w: logf, re: ready, found: found}
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 2 * time.Second // a grandchild holding the pipe cannot hang Wait
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, "", fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go p.wait(logf)
	if ready == nil {
		return p, "", nil
	}
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case v := <-found:
		return p, v, nil
	case <-p.done:
		return nil, "", fmt.Errorf("start %s: exited before it was ready (%v); log %s:\n%s", name, p.waitErr, logPath, tail(logPath))
	case <-timer.C:
		p.kill()
		return nil, "", fmt.Errorf("start %s: not ready after %v; log %s:\n%s", name, readyTimeout, logPath, tail(logPath))
	case <-ctx.Done():
		p.kill()
		return nil, "", fmt.Errorf("start %s: %w", name, ctx.Err())
	}
}

// wait is the process's waiter goroutine; it owns the log file.
func (p *proc) wait(logf *os.File) {
	p.waitErr = p.cmd.Wait()
	logf.Close()
	close(p.done)
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

// signal sends sig to the whole process group.
func (p *proc) signal(sig syscall.Signal) {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
}

// kill sends SIGKILL to the process group and waits for the process.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM to the process group, waits up to grace, then kills.
func (p *proc) stop(grace time.Duration) {
	p.signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.kill()
	}
}

// tail returns the last lines of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	const max = 4 << 10
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// FreePort returns a loopback TCP port that was free a moment ago: it
// binds 127.0.0.1:0 and releases the port.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// freeAddr is FreePort as host:port.
func freeAddr() (string, error) {
	p, err := FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// runOut runs a short command (clodexctl, --help probes) and returns its
// stdout; a failure carries stderr.
func runOut(ctx context.Context, timeout time.Duration, path string, args, env []string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return stdout.Bytes(), fmt.Errorf("%w: %s", err, bytes.TrimSpace(stderr.Bytes()))
		}
		return stdout.Bytes(), err
	}
	return stdout.Bytes(), nil
}

// helpText returns what bin --help prints on stdout and stderr together.
func helpText(ctx context.Context, bin string, env []string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--help")
	cmd.Env = env
	out, _ := cmd.CombinedOutput() // some binaries exit 2 on --help
	return string(out)
}
