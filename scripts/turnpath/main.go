// Command turnpath measures which data-plane files one turn runs through.
//
//	go run ./scripts/turnpath [--check] [--keep DIR]
//
// It builds clodex-dataplane with coverage counters (go build -cover
// -covermode=count -coverpkg=<module>/...) and clodex-sim, then runs the data
// plane three times in front of the emulator, each session the same length:
// no turn; one turn, which opens a new upstream socket; two turns of one
// conversation, the second continuing on the socket the first left open.
// The control plane runs as its own process (clodex-controlplane, which the
// data plane joins with its own auth.json), so that what it runs is not
// counted as the data plane's; with --embedded it runs inside the data plane
// as it does for a single user, and the shared code it runs (the pacing
// bucket) counts too.
// Each turn is Claude Code 2.1.332's captured streaming request. A file is on
// a turn's path when a block of it ran more often with the turn than
// without: the new-socket turn compares the first two sessions, the
// held-socket turn the last two. Files of the control plane (the embedded one
// runs in the same process), the generated code, the emulator and cmd/ are
// not the data plane's and are left out.
//
// With --check it exits 1 when a path is over the targets (--max-new,
// --max-new-packages, --max-held).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/clodex/clodex/internal/captures"
)

const module = "github.com/clodex/clodex"

// session is how long each data plane runs after it is ready: the same for
// every session, so that timers (heartbeats, sweeps) fire as often in each.
const session = 3 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "turnpath:", err)
		os.Exit(1)
	}
}

type options struct {
	keep                        string
	check, embedded, funcs      bool
	maxNew, maxNewPkgs, maxHeld int
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	var o options
	fs := flag.NewFlagSet("turnpath", flag.ContinueOnError)
	fs.StringVar(&o.keep, "keep", "", "keep the binaries and coverage data in this directory (default a temporary one, removed)")
	fs.BoolVar(&o.check, "check", false, "exit 1 when a path is over its target")
	fs.BoolVar(&o.embedded, "embedded", false, "run the control plane inside the data plane (its shared code then counts)")
	fs.BoolVar(&o.funcs, "funcs", false, "also print, under each file, the functions whose blocks ran more often with the turn")
	fs.IntVar(&o.maxNew, "max-new", 15, "target: files on the new-socket turn's path")
	fs.IntVar(&o.maxNewPkgs, "max-new-packages", 7, "target: packages on the new-socket turn's path")
	fs.IntVar(&o.maxHeld, "max-held", 12, "target: files on the held-socket turn's path")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir := o.keep
	if dir == "" {
		d, err := os.MkdirTemp("", "turnpath-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}

	dp, sim, cp := filepath.Join(dir, "clodex-dataplane"), filepath.Join(dir, "clodex-sim"), filepath.Join(dir, "clodex-controlplane")
	if err := gobuild(ctx, "-cover", "-covermode=count", "-coverpkg="+module+"/...", "-o", dp, "./cmd/clodex-dataplane"); err != nil {
		return err
	}
	if err := gobuild(ctx, "-o", sim, "./cmd/clodex-sim"); err != nil {
		return err
	}
	if err := gobuild(ctx, "-o", cp, "./cmd/clodex-controlplane"); err != nil {
		return err
	}

	simAddr, err := freeAddr()
	if err != nil {
		return err
	}
	auth := filepath.Join(dir, "auth.json")
	simCmd := exec.CommandContext(ctx, sim, "--listen", simAddr, "--write-auth", auth, "--log-level", "warn")
	simCmd.Stderr = os.Stderr
	if err := simCmd.Start(); err != nil {
		return fmt.Errorf("start clodex-sim: %w", err)
	}
	defer func() { _ = simCmd.Process.Kill(); _ = simCmd.Wait() }()
	if err := waitFile(ctx, auth); err != nil {
		return fmt.Errorf("clodex-sim: %w", err)
	}

	var fleet []string // the data plane's flags that join the control plane
	if !o.embedded {
		var stop func()
		if fleet, stop, err = startControlPlane(ctx, cp, dir); err != nil {
			return err
		}
		defer stop()
	}

	counts := make([]map[string]int64, 3)
	for turns := range 3 {
		before, err := simStats(ctx, simAddr)
		if err != nil {
			return err
		}
		cov := filepath.Join(dir, fmt.Sprintf("cov-%d", turns))
		if err := os.MkdirAll(cov, 0o700); err != nil {
			return err
		}
		if err := runSession(ctx, dp, cov, simAddr, auth, fleet, turns); err != nil {
			return fmt.Errorf("session with %d turns: %w", turns, err)
		}
		after, err := simStats(ctx, simAddr)
		if err != nil {
			return err
		}
		// The sessions must be what they claim: one socket per turn-taking
		// session, the second turn continued on it.
		wantUpgrades, wantContinued := min(turns, 1), max(turns-1, 0)
		if got := after.Upgrades - before.Upgrades; got != int64(wantUpgrades) {
			return fmt.Errorf("session with %d turns opened %d upstream sockets, want %d", turns, got, wantUpgrades)
		}
		if got := after.ContinuedResponses - before.ContinuedResponses; got != int64(wantContinued) {
			return fmt.Errorf("session with %d turns continued %d responses on a held socket, want %d", turns, got, wantContinued)
		}
		if counts[turns], err = readCounts(ctx, cov); err != nil {
			return err
		}
	}

	newPath := onPath(counts[0], counts[1])
	heldPath := onPath(counts[1], counts[2])
	over := report(stdout, "new-socket turn", newPath, o.maxNew, o.maxNewPkgs)
	over = report(stdout, "held-socket turn", heldPath, o.maxHeld, 0) || over
	if o.funcs {
		printFuncs(stdout, "new-socket turn", counts[0], counts[1])
		printFuncs(stdout, "held-socket turn", counts[1], counts[2])
	}
	if o.check && over {
		return errors.New("a turn's path is over its target")
	}
	return nil
}

func gobuild(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", append([]string{"build"}, args...)...) //nolint:gosec // G204: the arguments are this program's own
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func waitFile(ctx context.Context, path string) error {
	for range 200 {
		if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s was not written in 10 s", path)
}

type stats struct {
	Upgrades           int64 `json:"upgrades"`
	ContinuedResponses int64 `json:"continued_responses"`
}

func simStats(ctx context.Context, addr string) (stats, error) {
	var st stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/sim/stats", nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, fmt.Errorf("clodex-sim stats: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("clodex-sim stats: %w", err)
	}
	return st, nil
}

// runSession runs the data plane with GOCOVERDIR=cov, sends turns turns of
// one conversation, and stops it (SIGTERM: it writes its counters on the way
// out) session after it was ready.
func runSession(ctx context.Context, dp, cov, simAddr, auth string, fleet []string, turns int) error {
	listen, err := freeAddr()
	if err != nil {
		return err
	}
	args := append([]string{"--listen", listen, "--codex-auth", auth,
		"--upstream-url", "ws://" + simAddr + "/backend-api/codex/responses",
		"--token-endpoint", "http://" + simAddr + "/oauth/token", "--log-level", "warn"}, fleet...)
	cmd := exec.CommandContext(ctx, dp, args...)
	cmd.Env = append(os.Environ(), "GOCOVERDIR="+cov)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start clodex-dataplane: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && !strings.Contains(line, "ready") {
			err = fmt.Errorf("unexpected first line %q", line)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case err := <-ready:
		if err != nil {
			return fmt.Errorf("clodex-dataplane did not say it is ready: %w", err)
		}
	case <-time.After(30 * time.Second):
		return errors.New("clodex-dataplane was not ready in 30 s")
	}
	start := time.Now()
	if err := converse(ctx, "http://"+listen, turns); err != nil {
		return err
	}
	if left := session - time.Since(start); left > 0 {
		time.Sleep(left)
	} else {
		return fmt.Errorf("the turns took %v, longer than a session (%v)", time.Since(start), session)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("clodex-dataplane: %w", err)
	}
	return nil
}

// startControlPlane starts clodex-controlplane for the data plane to join
// and returns the data plane's flags that join it. The process is killed
// when ctx ends.
func startControlPlane(ctx context.Context, cp, dir string) (flags []string, stop func(), err error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, nil, err
	}
	admin, agent := filepath.Join(dir, "admin.token"), filepath.Join(dir, "agent.token")
	for i, f := range []string{admin, agent} {
		if err := os.WriteFile(f, []byte(fmt.Sprintf("turnpath-token-%d-%d\n", i, time.Now().UnixNano())), 0o600); err != nil {
			return nil, nil, err
		}
	}
	data := filepath.Join(dir, "controlplane")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, cp, "--listen", addr, "--data-dir", data,
		"--admin-token-file", admin, "--agent-token-file", agent, "--log-level", "warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start clodex-controlplane: %w", err)
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	for range 200 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return []string{"--control-plane", addr, "--agent-token-file", agent}, stop, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	return nil, nil, fmt.Errorf("clodex-controlplane did not listen on %s in 10 s", addr)
}

// converse sends turns turns of one Claude Code conversation: the captured
// first request, then the same with the reply and a new user message.
func converse(ctx context.Context, base string, turns int) error {
	raw, err := captures.ReadFile("claude-code/cc-2.1.332-messages-request-bare.json")
	if err != nil {
		return err
	}
	var capture struct {
		Path    string            `json:"path"`
		Headers map[string]string `json:"headers"`
		Body    map[string]any    `json:"body"`
	}
	if err := json.Unmarshal(raw, &capture); err != nil {
		return fmt.Errorf("decode the capture: %w", err)
	}
	body := capture.Body
	for i := range turns {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+capture.Path, bytes.NewReader(b))
		if err != nil {
			return err
		}
		for _, h := range []string{"Content-Type", "User-Agent", "X-Claude-Code-Session-Id", "anthropic-beta", "anthropic-version", "x-app"} {
			req.Header.Set(h, capture.Headers[h])
		}
		req.Header.Set("x-api-key", "turnpath")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("turn %d: %w", i+1, err)
		}
		text, err := readSSE(resp)
		if err != nil {
			return fmt.Errorf("turn %d: %w", i+1, err)
		}
		msgs, _ := body["messages"].([]any)
		body["messages"] = append(slices.Clone(msgs),
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": text}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "and once more"}}})
	}
	return nil
}

// readSSE reads a streamed answer and returns its text.
func readSSE(resp *http.Response) (string, error) {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	stopped := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type  string `json:"type"`
			Delta struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"delta"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return "", fmt.Errorf("SSE data %q: %w", data, err)
		}
		switch ev.Type {
		case "content_block_delta":
			if ev.Delta.Type == "text_delta" {
				text.WriteString(ev.Delta.Text)
			}
		case "message_stop":
			stopped = true
		case "error":
			return "", fmt.Errorf("SSE error event: %s", data)
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if !stopped || text.Len() == 0 {
		return "", errors.New("the stream ended without message_stop and text")
	}
	return text.String(), nil
}

// readCounts converts a GOCOVERDIR to text and sums each block's count.
func readCounts(ctx context.Context, cov string) (map[string]int64, error) {
	txt := cov + ".txt"
	cmd := exec.CommandContext(ctx, "go", "tool", "covdata", "textfmt", "-i="+cov, "-o="+txt) //nolint:gosec // G204: cov is a directory this program made
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go tool covdata textfmt -i=%s: %w", cov, err)
	}
	f, err := os.Open(txt)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	counts := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") {
			continue
		}
		// file.go:12.34,15.2 3 7
		fields := strings.Fields(line)
		if len(fields) != 3 {
			continue
		}
		n, err := strconv.ParseInt(fields[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", txt, line, err)
		}
		counts[fields[0]] += n
	}
	return counts, sc.Err()
}

// onPath returns the data-plane files (module-relative) with a block that
// ran more often in with than in without.
func onPath(without, with map[string]int64) []string {
	seen := map[string]bool{}
	for block, n := range with {
		if n <= without[block] {
			continue
		}
		file, _, _ := strings.Cut(block, ":")
		file = strings.TrimPrefix(file, module+"/")
		if dataPlane(file) {
			seen[file] = true
		}
	}
	files := make([]string, 0, len(seen))
	for f := range seen {
		files = append(files, f)
	}
	slices.Sort(files)
	return files
}

// dataPlane reports whether a module file belongs to the data plane's turn
// code: not the control plane, generated code, the emulator or a command.
func dataPlane(file string) bool {
	for _, p := range []string{"controlplane/", "proto/", "internal/codexsim/", "cmd/"} {
		if strings.HasPrefix(file, p) {
			return false
		}
	}
	return true
}

// report prints a path grouped by package and reports whether it is over
// its targets (a zero target is not checked).
func report(w io.Writer, name string, files []string, maxFiles, maxPkgs int) bool {
	byPkg := map[string][]string{}
	var pkgs []string
	for _, f := range files {
		pkg := filepath.Dir(f)
		if _, ok := byPkg[pkg]; !ok {
			pkgs = append(pkgs, pkg)
		}
		byPkg[pkg] = append(byPkg[pkg], filepath.Base(f))
	}
	slices.Sort(pkgs)
	fmt.Fprintf(w, "%s: %d files in %d packages", name, len(files), len(pkgs))
	over := len(files) > maxFiles || (maxPkgs > 0 && len(pkgs) > maxPkgs)
	if maxPkgs > 0 {
		fmt.Fprintf(w, " (target: at most %d files in %d packages)", maxFiles, maxPkgs)
	} else {
		fmt.Fprintf(w, " (target: at most %d files)", maxFiles)
	}
	fmt.Fprintln(w)
	for _, p := range pkgs {
		fmt.Fprintf(w, "  %-28s %s\n", p, strings.Join(byPkg[p], " "))
	}
	return over
}
