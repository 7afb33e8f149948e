package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/node"
)

// The claude subcommand:
//
//	clodex-dataplane claude [--member-key-file FILE] [ARGS...]
//
// runs the user's Claude Code (`claude` on PATH) on clodex. It uses the
// data plane that answers on the local address (CLODEX_LISTEN, default
// 127.0.0.1:17645) when GET /healthz says it is one; otherwise it starts
// one in this process, assembled as `clodex-dataplane` with default flags
// (embedded control plane), in front of clodex-sim when there are no Codex
// credentials, as `make run` does. ARGS go to Claude Code unchanged; its
// exit status becomes ours (128+N when a signal N ended it), and the data
// plane started for the session shuts down when it exits.
//
// Claude Code runs in the user's own environment with these changes:
// ANTHROPIC_BASE_URL points at the data plane; the key travels as
// ANTHROPIC_AUTH_TOKEN (Authorization: Bearer), which Claude Code uses
// without the "Detected a custom API key" approval prompt and without the
// onboarding's connectivity check against Anthropic's servers, so a fresh
// HOME works offline; ANTHROPIC_API_KEY, CLAUDE_CODE_OAUTH_TOKEN and the
// provider switches (CLAUDE_CODE_USE_BEDROCK, _VERTEX, _FOUNDRY) are removed,
// since each would send Claude Code elsewhere or ask about the key;
// CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 (no telemetry, error reports or
// auto-update calls to Anthropic during the session) unless the user set
// it. A data plane the session started serves only while Claude Code runs:
// another session that found it loses it then. Nothing is written to
// Claude Code's settings (~/.claude.json, ~/.claude/): a first start shows
// Claude Code's own local onboarding (text style, security notes, folder
// trust) and Claude Code records the answers itself.
//
// With a member key (--member-key-file FILE before ARGS, or
// CLODEX_MEMBER_KEY_FILE) the session is a team member's: Claude Code
// sends that key, to the team's data plane (started with --member-keys)
// at CLODEX_LISTEN, which may then be any host:port; the session checks
// the key there first and starts no data plane of its own (one started
// here would serve no member keys).

const (
	// claudeCodeVersion is the Claude Code release clodex is tested with;
	// the install hint names it.
	claudeCodeVersion = "2.1.332"
	// claudeToken is the key Claude Code sends; a loopback data plane
	// accepts any.
	claudeToken = "clodex-local"
	// envListen overrides the data plane's address, as for `make run`.
	envListen = "CLODEX_LISTEN"
	// envMemberKeyFile is the file of a member key, as --member-key-file.
	envMemberKeyFile = "CLODEX_MEMBER_KEY_FILE"
	// envStateHome locates the session's logs.
	envStateHome = "XDG_STATE_HOME"
	// envPath is searched for claude and clodex-sim.
	envPath = "PATH"
)

// Bounds of the session's set-up, shutdown and log.
const (
	probeTimeout    = 3 * time.Second
	simStartTimeout = 30 * time.Second
	simStopTimeout  = 5 * time.Second
	logLimit        = 10 << 20 // a session log larger than this starts afresh
)

// claudeEnvRemoved are the variables Claude Code does not inherit.
var claudeEnvRemoved = []string{
	"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "CLAUDE_CODE_OAUTH_TOKEN",
	"CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY",
}

// claudeIO is what a claude session takes from its process: injected so
// tests can run sessions in-process.
type claudeIO struct {
	lookupEnv func(string) (string, bool)
	environ   []string // the environment Claude Code inherits, before the changes above
	// executable is this program; clodex-sim is looked for beside it first.
	executable string
	// signals delivers SIGINT, SIGQUIT, SIGTERM and SIGHUP.
	signals        <-chan os.Signal
	stdin          io.Reader
	stdout, stderr io.Writer
}

// mainClaude runs `clodex-dataplane claude ARGS` and returns the exit code.
func mainClaude(args []string) int {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	exe, _ := os.Executable() // "" when unknown: clodex-sim is then looked for on PATH only
	code, err := runClaude(context.Background(), args, claudeIO{
		lookupEnv:  os.LookupEnv,
		environ:    os.Environ(),
		executable: exe,
		signals:    sigs,
		stdin:      os.Stdin,
		stdout:     os.Stdout,
		stderr:     os.Stderr,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "clodex-dataplane claude:", err)
	}
	return code
}

// runClaude is one session: find Claude Code, find or start the data
// plane, run Claude Code with args until it exits, shut down what was
// started. It returns Claude Code's exit code, or 1 with an error when the
// session could not start.
func runClaude(ctx context.Context, args []string, cio claudeIO) (int, error) {
	getenv := func(k string) string { v, _ := cio.lookupEnv(k); return v }
	addr := node.DefaultListen
	if v := getenv(envListen); v != "" {
		addr = v
	}
	keyFile, args := memberKeyFile(args, getenv(envMemberKeyFile))
	key := claudeToken
	if keyFile != "" {
		tok, warning, err := bearer.ReadFile(keyFile)
		if err != nil {
			return 1, fmt.Errorf("read the member key: %w", err)
		}
		if warning != "" {
			fmt.Fprintln(cio.stderr, "clodex: warning: member key file:", warning)
		}
		key = tok.Reveal()
	}
	if _, _, err := net.SplitHostPort(addr); err != nil || (keyFile == "" && !loopbackHostPort(addr)) {
		return 1, fmt.Errorf("%s=%q: the session's data plane must listen on a loopback host:port, e.g. 127.0.0.1:17645 (any host:port with a member key)", envListen, addr)
	}
	bin, ok := findExecutable("claude", getenv(envPath))
	if !ok {
		return 1, fmt.Errorf("claude (Claude Code) is not on PATH; install the version clodex is tested with: npm install -g @anthropic-ai/claude-code@%s", claudeCodeVersion)
	}
	s := &session{} // a member's session uses the team's data plane: it starts nothing
	if keyFile != "" {
		if err := checkMemberKey(ctx, addr, key); err != nil {
			return 1, err
		}
		fmt.Fprintf(cio.stderr, "clodex: using the team's data plane on %s with your member key\n", addr)
	} else {
		// Until Claude Code runs, SIGINT or SIGTERM abandons the set-up.
		setupCtx, cancelSetup := context.WithCancel(ctx)
		defer cancelSetup()
		stopWatch, watchDone := make(chan struct{}), make(chan struct{})
		go watchSetup(cio.signals, cancelSetup, stopWatch, watchDone)
		var err error
		s, err = startSession(setupCtx, addr, cio)
		close(stopWatch)
		<-watchDone
		if err != nil {
			return 1, err
		}
	}
	defer s.close(cio.stderr)

	cmd := exec.Command(bin, args...) //nolint:gosec // G702: runs the claude on the user's PATH with the user's own arguments; launching it is what this command is for
	cmd.Env = claudeEnviron(cio.environ, "http://"+addr, key)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = cio.stdin, cio.stdout, cio.stderr
	if err := cmd.Start(); err != nil {
		return 1, fmt.Errorf("start %s: %w", bin, err)
	}
	return superviseClaude(cmd, cio.signals)
}

// watchSetup cancels the set-up on SIGINT, SIGTERM or SIGHUP until stop is
// closed.
func watchSetup(sigs <-chan os.Signal, cancel context.CancelFunc, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case sig := <-sigs:
			if sig != syscall.SIGQUIT {
				cancel()
				return
			}
		case <-stop:
			return
		}
	}
}

// superviseClaude waits for Claude Code and returns its exit code (128+N
// when signal N ended it). SIGTERM and SIGHUP sent to this process are
// passed on. SIGINT and SIGQUIT are not: Claude Code shares this process's
// terminal process group, so a Ctrl-C typed there already reached it, and
// Claude Code reads a second Ctrl-C as "exit".
func superviseClaude(cmd *exec.Cmd, sigs <-chan os.Signal) (int, error) {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGTERM || sig == syscall.SIGHUP {
				// It fails only once Claude Code has exited, which done reports next.
				_ = cmd.Process.Signal(sig)
			}
		case err := <-done:
			if cmd.ProcessState == nil { // Wait failed before the process was reaped
				return 1, fmt.Errorf("wait for %s: %w", cmd.Path, err)
			}
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if ok && ws.Signaled() {
				return 128 + int(ws.Signal()), nil
			}
			return cmd.ProcessState.ExitCode(), nil
		}
	}
}

// claudeEnviron is environ with the session's changes (see the top of
// this file); key is what Claude Code sends as ANTHROPIC_AUTH_TOKEN.
func claudeEnviron(environ []string, baseURL, key string) []string {
	env := make([]string, 0, len(environ)+4)
	nonessential := false
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, r := range claudeEnvRemoved {
			if k == r {
				drop = true
			}
		}
		if k == "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC" {
			if kv == k+"=" {
				drop = true // set but empty: as if unset
			} else {
				nonessential = true
			}
		}
		if !drop {
			env = append(env, kv)
		}
	}
	env = append(env, "ANTHROPIC_BASE_URL="+baseURL, "ANTHROPIC_AUTH_TOKEN="+key)
	if !nonessential {
		env = append(env, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1")
	}
	return env
}

// loopbackHostPort reports whether addr is host:port with a loopback host.
func loopbackHostPort(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// findExecutable looks for an executable file name in the folders of
// path (absolute folders only: a relative one would depend on the working
// directory).
func findExecutable(name, path string) (string, bool) {
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// errNotListening reports that nothing listens on the probed address.
var errNotListening = errors.New("nothing listens there")

// probeDataPlane asks addr for GET /healthz. It returns nil when a clodex
// data plane answers, an error wrapping errNotListening when the
// connection is refused, and another error naming what answered.
func probeDataPlane(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("probe %s: %w", addr, errNotListening)
	}
	if err != nil {
		// Not wrapped: the hint has to come last.
		return fmt.Errorf("%s does not answer GET /healthz as a clodex data plane (%v); stop what listens there or set %s to another loopback address", addr, err, envListen)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var h struct {
		Service string `json:"service"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &h) != nil || h.Service != "clodex-dataplane" {
		return fmt.Errorf("%s is not a clodex data plane (GET /healthz answered %d %q); stop what listens there or set %s to another loopback address",
			addr, resp.StatusCode, strings.TrimSpace(string(body)), envListen)
	}
	return nil
}

// session is what a claude session started for itself: a data plane, an
// emulator, a scratch folder. The zero value (a data plane already
// running) owns nothing.
type session struct {
	dp        *node.Node
	serveDone chan error // receives Serve's result
	stopServe context.CancelFunc
	sim       *exec.Cmd
	simWait   chan struct{} // closed when the emulator has exited
	scratch   string
	log       *os.File
}

// startSession finds the data plane on addr or starts one.
func startSession(ctx context.Context, addr string, cio claudeIO) (_ *session, err error) {
	err = probeDataPlane(ctx, addr)
	if err == nil {
		fmt.Fprintf(cio.stderr, "clodex: using the clodex data plane on %s\n", addr)
		return &session{}, nil
	}
	if !errors.Is(err, errNotListening) {
		return nil, err
	}
	s := &session{}
	defer func() {
		if err != nil {
			s.close(cio.stderr)
		}
	}()
	getenv := func(k string) string { v, _ := cio.lookupEnv(k); return v }
	logDir, err := stateDir(getenv)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(logDir, "dataplane.log")
	if s.log, err = openLog(logPath); err != nil {
		return nil, err
	}
	fmt.Fprintf(s.log, "\n== clodex-dataplane claude session %s, pid %d\n", time.Now().Format(time.RFC3339), os.Getpid())

	args := []string{"--listen", addr}
	auth := defaultCodexAuth(cio.lookupEnv)
	if _, statErr := os.Stat(auth); statErr != nil {
		simArgs, err := s.startSim(ctx, cio, filepath.Join(logDir, "sim.log"))
		if err != nil {
			return nil, fmt.Errorf("no Codex credentials at %s (sign in with `codex login` to use your account), and the emulator could not start: %w", auth, err)
		}
		args = append(args, simArgs...)
		fmt.Fprintf(cio.stderr, "clodex: no Codex credentials at %s; started clodex-sim, the backend emulator, for this session\n", auth)
	}
	cfg, err := loadConfig(args, cio.lookupEnv, s.log)
	if err != nil {
		return nil, err
	}
	// Its export line and its log go to the session log: Claude Code's
	// TUI owns the terminal.
	d, err := node.Start(ctx, cfg.Config, s.log, s.log)
	if errors.Is(err, syscall.EADDRINUSE) && probeDataPlane(ctx, addr) == nil {
		// Another session started one in the meantime: use it.
		s.close(cio.stderr)
		fmt.Fprintf(cio.stderr, "clodex: using the clodex data plane on %s\n", addr)
		return &session{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("start the data plane (log: %s): %w", logPath, err)
	}
	s.dp = d
	serveCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stopServe, s.serveDone = stop, make(chan error, 1)
	go s.serve(serveCtx)
	fmt.Fprintf(cio.stderr, "clodex: started a data plane on %s for this session (log: %s); it stops when Claude Code exits\n", addr, logPath)
	return s, nil
}

// serve runs the data plane until ctx ends.
func (s *session) serve(ctx context.Context) { s.serveDone <- s.dp.Serve(ctx) }

// startSim starts clodex-sim on an ephemeral loopback port with
// credentials it issued in a scratch folder, and returns the data plane
// flags that point at it.
func (s *session) startSim(ctx context.Context, cio claudeIO, logPath string) ([]string, error) {
	getenv := func(k string) string { v, _ := cio.lookupEnv(k); return v }
	var simBin string
	if cio.executable != "" {
		if p, ok := findExecutable("clodex-sim", filepath.Dir(cio.executable)); ok {
			simBin = p
		}
	}
	if simBin == "" {
		p, ok := findExecutable("clodex-sim", getenv(envPath))
		if !ok {
			return nil, fmt.Errorf("clodex-sim is neither beside %s nor on PATH; build it with `make build` (bin/clodex-sim)", cio.executable)
		}
		simBin = p
	}
	var err error
	if s.scratch, err = os.MkdirTemp("", "clodex-claude-"); err != nil {
		return nil, fmt.Errorf("create the emulator's folder: %w", err)
	}
	simLog, err := openLog(logPath)
	if err != nil {
		return nil, err
	}
	defer simLog.Close() // the child has its own descriptor
	authPath := filepath.Join(s.scratch, "auth.json")
	cmd := exec.Command(simBin, "--listen", "127.0.0.1:0", "--write-auth", authPath, "--log-level", "warn")
	cmd.Stderr = simLog
	// Its own process group: a Ctrl-C typed for Claude Code must not stop it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", simBin, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", simBin, err)
	}
	s.sim, s.simWait = cmd, make(chan struct{})
	lines := make(chan string, 1)
	go readFirstLine(out, lines)
	go s.waitSim()

	timer := time.NewTimer(simStartTimeout)
	defer timer.Stop()
	var line string
	select {
	case line = <-lines:
	case <-s.simWait:
		line = <-lines
	case <-timer.C:
		return nil, fmt.Errorf("%s printed no URL in %v (log: %s)", simBin, simStartTimeout, logPath)
	case <-ctx.Done():
		return nil, fmt.Errorf("start %s: %w", simBin, ctx.Err())
	}
	u, err := url.Parse(strings.TrimSpace(line))
	if line == "" || err != nil || u.Host == "" {
		return nil, fmt.Errorf("%s did not start (printed %q; log: %s)", simBin, line, logPath)
	}
	return []string{"--codex-auth", authPath, "--upstream-url", u.String(), "--token-endpoint", "http://" + u.Host + "/oauth/token"}, nil
}

// readFirstLine sends r's first line ("" if there is none) and then reads r
// to its end, so the writer never blocks.
func readFirstLine(r io.Reader, lines chan<- string) {
	br := bufio.NewReader(r)
	line, _ := br.ReadString('\n')
	lines <- line
	_, _ = io.Copy(io.Discard, br) // a read error only means the emulator's stdout closed
}

// waitSim reaps the emulator.
func (s *session) waitSim() {
	defer close(s.simWait)
	_ = s.sim.Wait() // stopped by close; its exit status does not matter
}

// close shuts down what the session started: the data plane (in-flight
// turns finish within its shutdown grace), then the emulator (SIGTERM,
// then SIGKILL after simStopTimeout), then the scratch folder.
func (s *session) close(stderr io.Writer) {
	if s.dp != nil {
		s.stopServe()
		if err := <-s.serveDone; err != nil {
			fmt.Fprintln(stderr, "clodex: data plane:", err)
		}
	}
	if s.sim != nil {
		// Signal and Kill fail only once the emulator has exited, which
		// closes simWait.
		_ = s.sim.Process.Signal(syscall.SIGTERM)
		timer := time.NewTimer(simStopTimeout)
		select {
		case <-s.simWait:
		case <-timer.C:
			_ = s.sim.Process.Kill()
			<-s.simWait
		}
		timer.Stop()
	}
	if s.scratch != "" {
		os.RemoveAll(s.scratch)
	}
	if s.log != nil {
		s.log.Close()
	}
}

// stateDir is $XDG_STATE_HOME/clodex/claude (default
// ~/.local/state/clodex/claude), created private to the user.
func stateDir(getenv func(string) string) (string, error) {
	base := getenv(envStateHome)
	if base == "" {
		home := getenv(envHome)
		if home == "" {
			return "", fmt.Errorf("neither %s nor %s is set; the session's logs need a folder", envStateHome, envHome)
		}
		base = filepath.Join(home, ".local", "state")
	}
	dir := filepath.Join(base, "clodex", "claude")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("create the log folder: %w", err)
	}
	return dir, nil
}

// openLog opens path for appending (mode 0600), starting it afresh when it
// has grown beyond logLimit.
func openLog(path string) (*os.File, error) {
	flags := os.O_WRONLY | os.O_CREATE | os.O_APPEND
	if fi, err := os.Stat(path); err == nil && fi.Size() > logLimit {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the session log: %w", err)
	}
	return f, nil
}

// memberKeyFile returns the member key file of a session and Claude
// Code's arguments: --member-key-file FILE (or =FILE) as the first
// argument, else env (CLODEX_MEMBER_KEY_FILE); "" for none.
func memberKeyFile(args []string, env string) (string, []string) {
	if len(args) > 0 {
		if f, ok := strings.CutPrefix(args[0], "--member-key-file="); ok {
			return f, args[1:]
		}
		if args[0] == "--member-key-file" && len(args) > 1 {
			return args[1], args[2:]
		}
	}
	return strings.TrimSpace(env), args
}

// checkMemberKey asks the data plane at addr whether it serves key (GET
// /v1/models, which runs no turn): nil when it does, else what is wrong
// and what to do. The key never appears in the error.
func checkMemberKey(ctx context.Context, addr, key string) error {
	if err := probeDataPlane(ctx, addr); err != nil {
		if errors.Is(err, errNotListening) {
			return fmt.Errorf("no clodex data plane answers on %s: a member key is for the team's data plane (started with --member-keys); set %s to its host:port", addr, envListen)
		}
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/models", nil)
	if err != nil {
		return fmt.Errorf("check the member key on %s: %w", addr, err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return fmt.Errorf("check the member key on %s: %w", addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	var e struct{ Error struct{ Message string } }
	_ = json.Unmarshal(body, &e)
	return fmt.Errorf("the data plane on %s refuses the member key (%d: %s)", addr, resp.StatusCode, e.Error.Message)
}
