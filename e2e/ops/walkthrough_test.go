package ops

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// setupHeading starts the section whose blocks the walkthrough runs; the
// section ends at the next heading of its level or above.
const setupHeading = "### 1.1 "

// blockTimeout bounds one block; the blocks wait for their servers with
// clodexctl health --wait 10s, so a block that outlasts this is stuck.
const blockTimeout = 60 * time.Second

// shellBlocks returns the ```sh blocks of the section of markdown that
// starts with a line beginning heading.
func shellBlocks(markdown, heading string) ([]string, error) {
	lines := strings.Split(markdown, "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, heading) })
	if start < 0 {
		return nil, fmt.Errorf("no section %q", strings.TrimSpace(heading))
	}
	level := strings.Index(heading, " ") // the number of #s
	var blocks []string
	var cur []string
	in := false
	for _, l := range lines[start+1:] {
		if !in && strings.HasPrefix(l, "#") {
			if n := len(l) - len(strings.TrimLeft(l, "#")); n <= level && strings.HasPrefix(l[n:], " ") {
				break
			}
		}
		switch {
		case !in && strings.TrimSpace(l) == "```sh":
			in, cur = true, nil
		case in && strings.TrimSpace(l) == "```":
			in = false
			blocks = append(blocks, strings.Join(cur, "\n"))
		case in:
			cur = append(cur, l)
		}
	}
	if in {
		return nil, errors.New("a ```sh block is not closed")
	}
	return blocks, nil
}

// portPattern finds the ports the blocks name: after a loopback address
// or redis-server's --port.
var portPattern = regexp.MustCompile(`(?:127\.0\.0\.1:|--port )(\d{2,5})\b`)

// substitutePorts replaces every port the blocks name (portPattern),
// wherever the number appears as a word, with the one ports gives it.
// The substitution is the walkthrough's only change to the blocks.
func substitutePorts(blocks []string, ports func() (int, error)) ([]string, map[string]string, error) {
	sub := map[string]string{}
	for _, b := range blocks {
		for _, m := range portPattern.FindAllStringSubmatch(b, -1) {
			if _, ok := sub[m[1]]; ok {
				continue
			}
			p, err := ports()
			if err != nil {
				return nil, nil, err
			}
			sub[m[1]] = strconv.Itoa(p)
		}
	}
	out := make([]string, len(blocks))
	for i, b := range blocks {
		out[i] = regexp.MustCompile(`\b\d{2,5}\b`).ReplaceAllStringFunc(b, func(n string) string {
			if p, ok := sub[n]; ok {
				return p
			}
			return n
		})
	}
	return out, sub, nil
}

// marker is the line the walkthrough prints after each block.
const marker = "@@ops block done "

// walkResult is what one run of the blocks showed.
type walkResult struct {
	output string          // stdout and stderr, markers included
	took   []time.Duration // per finished block
}

// walkError is a block that failed or hung.
type walkError struct {
	block   int // 1-based
	text    string
	reason  string
	outTail string
}

func (e *walkError) Error() string {
	return fmt.Sprintf("block %d %s:\n----\n%s\n---- output (last lines):\n%s", e.block, e.reason, e.text, e.outTail)
}

// walk runs blocks in one bash (errexit, nounset, pipefail) in dir with
// env, one after the other, each within blockTimeout. Every process the
// blocks start is in one process group, killed when walk returns.
func walk(ctx context.Context, dir string, env []string, blocks []string) (walkResult, error) {
	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	for i, b := range blocks {
		fmt.Fprintf(&script, "%s\necho '%s%d'\n", b, marker, i+1)
	}
	path := filepath.Join(dir, ".walkthrough.sh")
	if err := os.WriteFile(path, []byte(script.String()), 0o600); err != nil {
		return walkResult{}, err
	}
	defer os.Remove(path)
	pr, pw := io.Pipe()
	cmd := exec.Command("bash", "--noprofile", "--norc", path)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return walkResult{}, fmt.Errorf("start bash: %w", err)
	}
	pgid := cmd.Process.Pid
	killGroup := func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) }
	defer killGroup()
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		_ = pw.Close()
		exited <- err
	}()

	var (
		mu    sync.Mutex
		out   strings.Builder
		done  int
		lines = make(chan int, len(blocks)+1)
	)
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			mu.Lock()
			out.WriteString(l + "\n")
			mu.Unlock()
			if n, ok := strings.CutPrefix(l, marker); ok {
				if k, err := strconv.Atoi(n); err == nil {
					lines <- k
				}
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	res := walkResult{}
	fail := func(reason string) error {
		killGroup()
		<-read
		mu.Lock()
		defer mu.Unlock()
		res.output = out.String()
		return &walkError{block: done + 1, text: blocks[min(done, len(blocks)-1)], reason: reason, outTail: lastLines(res.output, 30)}
	}
	started := time.Now()
	timer := time.NewTimer(blockTimeout)
	defer timer.Stop()
	for {
		select {
		case k := <-lines:
			done = k
			res.took = append(res.took, time.Since(started))
			started = time.Now()
			timer.Reset(blockTimeout)
		case err := <-exited:
			// Markers printed just before the exit may still be queued.
			<-read
			for len(lines) > 0 {
				done = <-lines
				res.took = append(res.took, time.Since(started))
			}
			if err != nil || done != len(blocks) {
				return res, fail(fmt.Sprintf("failed (%v)", err))
			}
			mu.Lock()
			res.output = out.String()
			mu.Unlock()
			return res, nil
		case <-timer.C:
			return res, fail(fmt.Sprintf("did not finish within %v", blockTimeout))
		case <-ctx.Done():
			return res, fail(ctx.Err().Error())
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
