// Package redistest runs a real redis-server on a free loopback port for
// tests:
//
//	srv := redistest.Start(t) // srv.URL; stopped at the test's cleanup
//	srv.Kill(); srv.Restart() // the same address; Pause and Resume freeze it
//
// A missing redis-server skips the test, except under CI=true, where it
// fails saying why.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is a running redis-server.
type Server struct {
	// Addr is "127.0.0.1:port"; it stays the same across Restart.
	Addr string
	// URL is "redis://" + Addr.
	URL string

	t   testing.TB
	bin string
	dir string

	mu  sync.Mutex // guards the following field
	cmd *exec.Cmd
}

// Start starts redis-server (no persistence) and kills it when the test
// ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redistest: redis-server is not installed (CI=true requires it; apt-get install redis-server): %v", err)
		}
		t.Skipf("redistest: redis-server is not installed: %v", err)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	var lastErr error
	for range 5 { // a port found free can be taken before redis binds it
		port, err := freePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.start(); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("redistest: %v", lastErr)
	}
	s.URL = "redis://" + s.Addr
	t.Cleanup(s.Kill)
	return s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start() error {
	_, port, _ := net.SplitHostPort(s.Addr)
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log")}
	cmd := exec.Command(s.bin, args...) //nolint:gosec // G204: s.bin is the redis-server found on PATH, the arguments this package's own
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for !pingOK(s.Addr) {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server on %s exited: %v\n%s", s.Addr, err, lastLines(string(log), 10))
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			err := <-exited // "signal: killed", or why it exited meanwhile
			return fmt.Errorf("redis-server on %s did not answer PING within 10s (%v)", s.Addr, err)
		}
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	return nil
}

func pingOK(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Kill kills redis-server (SIGKILL) and waits until its port refuses
// connections; it is safe to call more than once.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a paused server dies too
	_ = cmd.Process.Kill()
	for range 1000 {
		c, err := net.DialTimeout("tcp", s.Addr, 50*time.Millisecond)
		if err != nil {
			return
		}
		_ = c.Close()
		time.Sleep(2 * time.Millisecond)
	}
}

// Pause stops redis-server with SIGSTOP: it keeps its connections and
// answers nothing, as a hung server does, until Resume.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused redis-server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Restart starts a new redis-server on the same port (empty: nothing is
// persisted).
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	for range 100 { // the port of a killed server is normally free at once
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart: %v", err)
}

// NumSub returns the number of subscribers to channel (PUBSUB NUMSUB).
func (s *Server) NumSub(ctx context.Context, channel string) (int, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", s.Addr)
	if err != nil {
		return 0, fmt.Errorf("pubsub numsub: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	cmd := fmt.Sprintf("*3\r\n$6\r\nPUBSUB\r\n$6\r\nNUMSUB\r\n$%d\r\n%s\r\n", len(channel), channel)
	if _, err := c.Write([]byte(cmd)); err != nil {
		return 0, fmt.Errorf("pubsub numsub: %w", err)
	}
	// *2, $len, channel, :count
	rd := bufio.NewReader(c)
	var last string
	for range 4 {
		if last, err = rd.ReadString('\n'); err != nil {
			return 0, fmt.Errorf("pubsub numsub: %w", err)
		}
	}
	last = strings.TrimSpace(last)
	if !strings.HasPrefix(last, ":") {
		return 0, fmt.Errorf("pubsub numsub: unexpected reply %q", last)
	}
	return strconv.Atoi(last[1:])
}
