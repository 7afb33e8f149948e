package clienttest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// DefaultRunTimeout bounds a client run whose Timeout is zero.
const DefaultRunTimeout = 120 * time.Second

// process is one client invocation.
type process struct {
	bin     string
	args    []string
	env     []string
	dir     string
	timeout time.Duration
}

// processResult is what a finished client run left behind.
type processResult struct {
	stdout, stderr []byte
	exitCode       int // -1 when the process did not exit by itself
	err            error
}

// run starts p in its own process group, with stdin from /dev/null, and waits
// for it, at most p.timeout. Whatever the outcome, the whole process group is
// killed before run returns, so no helper the client spawned outlives it.
func (p process) run(ctx context.Context) processResult {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, p.bin, p.args...) //nolint:gosec // G204: p.bin is the pinned client this package installed
	cmd.Env = p.env
	cmd.Dir = p.dir
	cmd.Stdin = nil // /dev/null
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Start()
	if err != nil {
		return processResult{exitCode: -1, err: fmt.Errorf("start %s: %w", p.bin, err)}
	}
	err = cmd.Wait()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // leftovers of the group, if any
	res := processResult{stdout: stdout.Bytes(), stderr: stderr.Bytes(), exitCode: cmd.ProcessState.ExitCode()}
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		res.exitCode = -1
		res.err = fmt.Errorf("run %s: stopped after %v: %w", p.bin, p.timeout, ctx.Err())
	case err != nil && !errors.As(err, &exitErr):
		res.err = fmt.Errorf("run %s: %w", p.bin, err)
	}
	return res
}

// jsonLines parses every line of out that holds a JSON object; other lines
// are returned separately.
func jsonLines(out []byte) (objs []map[string]any, other []string) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 64*1024*1024)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		if json.Unmarshal(line, &m) == nil {
			objs = append(objs, m)
		} else {
			other = append(other, string(line))
		}
	}
	return objs, other
}

// checkLoopback returns an error unless raw is an absolute http(s) or ws(s)
// URL whose host is a loopback address or "localhost".
func checkLoopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("base URL %q: %w", raw, err)
	}
	switch u.Scheme {
	case "http", "https", "ws", "wss":
	default:
		return fmt.Errorf("base URL %q: scheme must be http, https, ws or wss", raw)
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("base URL %q: host must be a loopback address (127.0.0.1, ::1 or localhost); tests never reach real hosts", raw)
}

// baseEnv is the environment every client run starts from.
func baseEnv(home string) []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"TERM=dumb",
		"NO_COLOR=1",
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
