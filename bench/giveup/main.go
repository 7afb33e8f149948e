// Command giveup measures how long the real Claude Code takes to give up
// on a persistent upstream failure behind the data plane, per kind of
// failure: it starts clodex-sim and a data plane (package node, default
// configuration) in process, runs the pinned Claude Code 2.1.332 once per
// kind with its default retries, and prints, for each kind, the time from
// the start of Claude Code to its exit, the requests it made and what they
// were answered, and Claude Code's own retry delays.
//
//	go run ./bench/giveup                      # every kind, one after the other
//	go run ./bench/giveup -parallel -kinds server_error,unreachable
//
// Kinds:
//
//   - server_error: every response fails with server_error (#sim fail);
//   - upgrade_5xx: every WebSocket upgrade is answered 503;
//   - unreachable: nothing listens at the upstream address (connection
//     refused);
//   - rate_limit: every response fails with rate_limit_exceeded, a 429
//     without a hint (#sim fail).
//
// It uses only what the data plane and the emulator had before the
// failure memory, so the same file measures an older tree. It does not
// take the client run lock of internal/clienttest (a run can last fifteen
// minutes on an older tree): start it by hand, not alongside the test
// suite.
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
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/clodex/clodex/internal/clienttest"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "giveup:", err)
		os.Exit(1)
	}
}

// kinds are the failures measured, in the order printed.
var kinds = []string{"server_error", "upgrade_5xx", "unreachable", "rate_limit"}

const (
	simToken   = "tok-giveup"
	simAccount = "acct-giveup"
	model      = "claude-sonnet-4-5"
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("giveup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kindList := fs.String("kinds", strings.Join(kinds, ","), "comma-separated failure kinds: "+strings.Join(kinds, ", "))
	parallel := fs.Bool("parallel", false, "run the kinds at the same time (each has its own emulator and data plane)")
	claude := fs.String("claude", "", "Claude Code executable (default: the pinned one in the client cache)")
	retries := fs.Int("claude-retries", 10, "CLAUDE_CODE_MAX_RETRIES (10 is Claude Code 2.1.332's default)")
	timeout := fs.Duration("timeout", 25*time.Minute, "bound of one Claude Code run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var chosen []string
	for _, k := range strings.Split(*kindList, ",") {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		if !slices.Contains(kinds, k) {
			return fmt.Errorf("-kinds: %q is not a kind; allowed: %s", k, strings.Join(kinds, ", "))
		}
		chosen = append(chosen, k)
	}
	bin := *claude
	if bin == "" {
		cache, err := clienttest.CacheDir()
		if err != nil {
			return err
		}
		bin = filepath.Join(cache, "claude-code-"+clienttest.ClaudeCodeVersion, "node_modules", ".bin", "claude")
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("claude code: %w (run scripts/install-clients.sh, or pass -claude)", err)
	}

	results := make([]result, len(chosen))
	var wg sync.WaitGroup
	for i, k := range chosen {
		measure := func() {
			results[i] = measureKind(ctx, k, bin, *retries, *timeout)
			fmt.Fprintf(stderr, "giveup: %s done in %v\n", k, results[i].elapsed.Round(time.Second))
		}
		if *parallel {
			wg.Go(measure)
		} else {
			measure()
		}
	}
	wg.Wait()

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "kind\ttime to give up\texit\trequests\tanswers\tClaude Code retries (delay s)\tmessage")
	for i, r := range results {
		if r.err != nil {
			fmt.Fprintf(tw, "%s\terror: %v\n", chosen[i], r.err)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%d (%s)\t%s\n", chosen[i], r.elapsed.Round(100*time.Millisecond), r.exit,
			len(r.answers), summarise(r.answers), len(r.delays), strings.Join(r.delays, " "), clip(r.message, 160))
	}
	return tw.Flush()
}

// answer is one request Claude Code made and how it was answered.
type answer struct {
	status     int
	took       time.Duration
	retryAfter string
	shouldRet  string
}

type result struct {
	elapsed time.Duration
	exit    int
	answers []answer
	delays  []string // Claude Code's api_retry delays, seconds
	message string
	err     error
}

// summarise counts the answers by status and says how long the slowest
// took and which retry-after values were sent.
func summarise(as []answer) string {
	counts := map[int]int{}
	var slowest time.Duration
	var ras []string
	for _, a := range as {
		counts[a.status]++
		slowest = max(slowest, a.took)
		if a.retryAfter != "" {
			ras = append(ras, a.retryAfter)
		}
	}
	var parts []string
	for s, n := range counts {
		parts = append(parts, fmt.Sprintf("%d×%d", n, s))
	}
	slices.Sort(parts)
	s := strings.Join(parts, ",") + fmt.Sprintf("; slowest %v", slowest.Round(100*time.Millisecond))
	if len(ras) > 0 {
		s += "; retry-after " + strings.Join(ras, " ")
	}
	return s
}

func clip(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// measureKind runs one kind on its own emulator and data plane.
func measureKind(ctx context.Context, kind, bin string, retries int, timeout time.Duration) (r result) {
	dir, err := os.MkdirTemp("", "giveup-"+kind+"-")
	if err != nil {
		return result{err: err}
	}
	defer os.RemoveAll(dir)

	simCfg := codexsim.Config{AcceptTokens: map[string]string{simToken: simAccount}}
	prompt := "Say hello."
	switch kind {
	case "server_error":
		prompt += "\n#sim fail server_error"
	case "rate_limit":
		prompt += "\n#sim fail rate_limit_exceeded"
	case "upgrade_5xx":
		simCfg.Faults.Upgrade5xxShare, simCfg.Faults.Upgrade5xxStatus = 1, 503
	}
	sim, err := codexsim.New(simCfg)
	if err != nil {
		return result{err: err}
	}
	defer sim.Close()
	simLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{err: err}
	}
	simSrv := &http.Server{Handler: sim.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = simSrv.Serve(simLn) }() // ErrServerClosed once the deferred Close runs; a failure before shows in the turns
	defer simSrv.Close()
	upstreamURL := "ws://" + simLn.Addr().String() + codexsim.ChatGPTPath
	if kind == "unreachable" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return result{err: err}
		}
		upstreamURL = "ws://" + ln.Addr().String() + codexsim.ChatGPTPath
		ln.Close() // nothing listens there: connection refused
	}

	auth := filepath.Join(dir, "auth.json")
	b, _ := json.Marshal(map[string]any{"auth_mode": "chatgpt", "tokens": map[string]string{"access_token": simToken, "account_id": simAccount}})
	if err := os.WriteFile(auth, b, 0o600); err != nil {
		return result{err: err}
	}
	var logs bytes.Buffer
	n, err := node.Start(ctx, node.Config{
		Listen:        "127.0.0.1:0",
		UpstreamURL:   upstreamURL,
		TokenEndpoint: "http://" + simLn.Addr().String() + "/oauth/token",
		CodexAuth:     auth,
		Refresh:       node.RefreshNever,
	}, io.Discard, &lockedWriter{w: &logs})
	if err != nil {
		return result{err: fmt.Errorf("start the data plane: %w", err)}
	}
	nodeCtx, stopNode := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- n.Serve(nodeCtx) }()
	defer func() {
		stopNode()
		if err := <-served; err != nil && r.err == nil {
			r.err = fmt.Errorf("serve the data plane: %w", err)
		}
	}()

	// A recording proxy in front of the data plane: what Claude Code asked
	// and what it was told.
	target, _ := url.Parse("http://" + n.Addr())
	rec := &recorder{}
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }, FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			if resp.Request.URL.Path == "/v1/messages" {
				rec.add(answer{status: resp.StatusCode, took: time.Since(startOf(resp.Request)),
					retryAfter: resp.Header.Get("Retry-After"), shouldRet: resp.Header.Get("X-Should-Retry")})
			}
			return nil
		}}
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{err: err}
	}
	psrv := &http.Server{Handler: stamp(proxy), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = psrv.Serve(pln) }() // ErrServerClosed once the deferred Close runs; a failure before shows in the turns
	defer psrv.Close()

	home := filepath.Join(dir, "home")
	work := filepath.Join(dir, "work")
	for _, d := range []string{home, work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return result{err: err}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, bin, "-p", prompt, "--model", model, "--output-format", "stream-json", "--verbose", "--no-session-persistence")
	cmd.Dir = work
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home, "TERM=dumb", "NO_COLOR=1",
		"ANTHROPIC_BASE_URL=http://" + pln.Addr().String(), "ANTHROPIC_API_KEY=giveup",
		"DISABLE_AUTOUPDATER=1", "DISABLE_TELEMETRY=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		fmt.Sprintf("CLAUDE_CODE_MAX_RETRIES=%d", retries),
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout = &out
	start := time.Now()
	err = cmd.Run()
	r = result{elapsed: time.Since(start), exit: cmd.ProcessState.ExitCode(), answers: rec.all()}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		r.err = err
	}
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch {
		case l["type"] == "system" && l["subtype"] == "api_retry":
			ms, _ := l["retry_delay_ms"].(float64)
			r.delays = append(r.delays, fmt.Sprintf("%.1f", ms/1000))
		case l["type"] == "result":
			r.message, _ = l["result"].(string)
		}
	}
	return r
}

type startKey struct{}

// stamp notes when each request arrived, for the time it took.
func stamp(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), startKey{}, time.Now())))
	})
}

func startOf(r *http.Request) time.Time {
	t, _ := r.Context().Value(startKey{}).(time.Time)
	return t
}

type recorder struct {
	mu      sync.Mutex // guards answers
	answers []answer
}

func (r *recorder) add(a answer) {
	r.mu.Lock()
	r.answers = append(r.answers, a)
	r.mu.Unlock()
}

func (r *recorder) all() []answer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.answers)
}

type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
