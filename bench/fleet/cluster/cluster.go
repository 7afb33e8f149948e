package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/clodex/clodex/internal/atomicfile"
	"github.com/clodex/clodex/internal/codexsim"
)

// Binaries are the paths of the four clodex programs, and of
// redis-server for replicas.
type Binaries struct {
	Sim, ControlPlane, Ctl, DataPlane string
	// RedisServer is redis-server, needed only with Options.Replicas > 1.
	// (Optional; default redis-server on PATH)
	RedisServer string
}

// BinariesIn is the binaries as `make build` lays them out in dir.
func BinariesIn(dir string) Binaries {
	return Binaries{
		Sim:          filepath.Join(dir, "clodex-sim"),
		ControlPlane: filepath.Join(dir, "clodex-controlplane"),
		Ctl:          filepath.Join(dir, "clodexctl"),
		DataPlane:    filepath.Join(dir, "clodex-dataplane"),
	}
}

// Check reports every binary that is missing or not executable.
func (b Binaries) Check() error {
	var errs []error
	for _, p := range []string{b.Sim, b.ControlPlane, b.Ctl, b.DataPlane} {
		st, err := os.Stat(p)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("binary %s: %w (run make build)", p, err))
		case st.IsDir() || st.Mode()&0o111 == 0:
			errs = append(errs, fmt.Errorf("binary %s is not an executable file", p))
		}
	}
	return errors.Join(errs...)
}

// Build compiles the four programs of the module rooted at moduleDir into
// outDir with one `go build` (the build cache makes repeats fast).
func Build(ctx context.Context, goBin, moduleDir, outDir string) (Binaries, error) {
	args := []string{"build", "-o", outDir + string(os.PathSeparator),
		"./cmd/clodex-sim", "./cmd/clodex-controlplane", "./cmd/clodexctl", "./cmd/clodex-dataplane"}
	cmd := exec.CommandContext(ctx, goBin, args...) //nolint:gosec // G204: goBin is the go command the caller located; the arguments are fixed
	cmd.Dir = moduleDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("build binaries: %w\n%s", err, out)
	}
	return BinariesIn(outDir), nil
}

// Mode is how the data planes of a fleet admit new sockets.
type Mode int

const (
	// Central: every data plane joins one clodex-controlplane
	// (--control-plane), which owns the account's bucket.
	Central Mode = iota
	// PerHost: no control plane; each data plane paces itself with its
	// embedded control plane at the full rate
	// (CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN).
	PerHost
)

func (m Mode) String() string {
	if m == PerHost {
		return "per-host"
	}
	return "central"
}

// Options configure a fleet. Zero values take the defaults noted.
type Options struct {
	// Bins are the programs to run. (Required)
	Bins Binaries
	// Dir is a private working directory (auth files, tokens, logs,
	// the control plane's data). (Required)
	Dir string
	// Logger reports progress. (Optional; default discards)
	Logger *slog.Logger
	// Mode is Central or PerHost.
	Mode Mode
	// DataPlanes is how many clodex-dataplane processes run. (Default 3)
	DataPlanes int
	// Rate and Burst are the account's policy: set with clodexctl in
	// Central mode; in PerHost mode Rate is every data plane's
	// CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN (the burst stays the
	// environment default). (Default 120/min, burst 5)
	Rate, Burst int
	// UpgradeLimit and UpgradeWindow are clodex-sim's throttle: the
	// upgrade after UpgradeLimit accepted ones in a trailing window
	// answers 403. (Default 30 per 10 s)
	UpgradeLimit  int
	UpgradeWindow time.Duration
	// ControlPlaneAdmin serves the control plane's /metrics on a loopback
	// port (ControlPlane.AdminURL). (Optional)
	ControlPlaneAdmin bool
	// Replicas is how many control planes serve the fleet in Central
	// mode. 1 (the default) runs one on the memory store; 2 or more run
	// them as replicas over one redis-server (started on a free loopback
	// port; Binaries.RedisServer), and every data plane gets all their
	// addresses, --control-plane a,b,...
	Replicas int
	// DefaultPolicy leaves the account's policy at the control plane's
	// defaults (Rate and Burst are not set with clodexctl). (Optional)
	DefaultPolicy bool
	// AdaptiveOff switches the account's learned throttle off with
	// clodexctl set-adaptive ACCOUNT off (Central mode). (Optional)
	AdaptiveOff bool
	// DataPlaneArgs are extra flags for every data plane. (Optional)
	DataPlaneArgs []string
	// ReadyTimeout bounds each process's start. (Default 20 s)
	ReadyTimeout time.Duration
	// Broker runs the credential broker (Central mode only): clodex-sim
	// issues a real sign-in for Account (JWTs living TokenTTL), the
	// control planes hold it (--credential-key-file, the emulator's
	// --token-endpoint; Fleet.LoginAuth is imported with clodexctl account
	// import), and the data planes run without an auth.json, taking their
	// tokens from the broker. (Optional)
	Broker bool
	// TokenTTL is clodex-sim's access-token lifetime. (Optional; default
	// the emulator's, 1h)
	TokenTTL time.Duration
	// Env is added to every child's environment (NAME=value), e.g. the
	// OTEL_EXPORTER_OTLP_* variables that turn on trace export.
	// (Optional)
	Env []string
}

// The credential clodex-sim accepts and every data plane presents. The
// token is opaque (not a JWT), so the data plane takes the account from
// tokens.account_id.
const (
	Token   = "tok-fleet"
	Account = "acct-fleet"
)

// Fleet is clodex-sim, an optional control plane (or several replicas over
// a redis-server) and the data planes, as real processes on loopback.
type Fleet struct {
	opts        Options
	log         *slog.Logger
	env         []string
	refreshFlag bool // the data plane has --refresh
	redis       *proc
	redisURL    string // "" without replicas
	Sim         *Sim
	// ControlPlane is the first (or only) control plane; nil in PerHost
	// mode.
	ControlPlane *ControlPlane
	// ControlPlanes are every replica, ControlPlane first.
	ControlPlanes []*ControlPlane
	DataPlanes    []*DataPlane
	// LoginAuth is the auth.json clodex-sim wrote for Account with
	// Options.Broker (the sign-in the broker was given); "" otherwise.
	LoginAuth string
	// CredentialKey is the broker's --credential-key-file; "" without
	// Options.Broker.
	CredentialKey string
}

// Sim is a running clodex-sim.
type Sim struct {
	p *proc
	// URL is its HTTP base, http://127.0.0.1:PORT.
	URL string
	// WSURL is the ChatGPT Responses WebSocket URL.
	WSURL string
}

// DataPlane is a running clodex-dataplane.
type DataPlane struct {
	p *proc
	// BaseURL is its Anthropic API, http://127.0.0.1:PORT.
	BaseURL string
	// Log is its log file.
	Log string
}

// ControlPlane is a clodex-controlplane that can be killed and restarted
// on the same address with the same data directory.
type ControlPlane struct {
	f          *Fleet
	p          *proc
	restarts   int
	replica    string // the replica id over Redis; "" on the memory store
	Addr       string // gRPC host:port
	AdminAddr  string // host:port of /metrics, "" when off
	adminToken string // path
	agentToken string // path
	dataDir    string
}

// Start starts the fleet: clodex-sim, then (Central) the control plane and
// the account's policy, then the data planes. On error everything started
// is stopped.
func Start(ctx context.Context, opts Options) (_ *Fleet, err error) {
	if opts.DataPlanes == 0 {
		opts.DataPlanes = 3
	}
	if opts.Rate == 0 {
		opts.Rate = 120
	}
	if opts.Burst == 0 {
		opts.Burst = 5
	}
	if opts.UpgradeLimit == 0 {
		opts.UpgradeLimit = 30
	}
	if opts.UpgradeWindow == 0 {
		opts.UpgradeWindow = 10 * time.Second
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 20 * time.Second
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if opts.Dir == "" {
		return nil, errors.New("start fleet: Options.Dir is required")
	}
	if opts.Broker && opts.Mode != Central {
		return nil, errors.New("start fleet: Options.Broker needs Mode Central (the broker is the control plane's)")
	}
	if err := opts.Bins.Check(); err != nil {
		return nil, fmt.Errorf("start fleet: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	f := &Fleet{opts: opts, log: log, env: append(baseEnv(opts.Dir), opts.Env...)}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("start fleet: %w", err)
	}
	help := helpText(ctx, opts.Bins.DataPlane, f.env)
	if opts.Mode == Central && !strings.Contains(help, "-control-plane") {
		return nil, fmt.Errorf("start fleet: %s --help lists no --control-plane flag; central mode needs a data plane that can join a control plane", opts.Bins.DataPlane)
	}
	f.refreshFlag = strings.Contains(help, "-refresh")
	if err := f.startSim(ctx); err != nil {
		return nil, err
	}
	if opts.Mode == Central {
		if opts.Replicas > 1 {
			if err := f.startRedis(ctx); err != nil {
				return nil, err
			}
		}
		for i := range opts.Replicas {
			if err := f.startControlPlane(ctx, i); err != nil {
				return nil, err
			}
		}
		if !opts.DefaultPolicy {
			if _, err := f.ControlPlane.SetRate(ctx, opts.Rate, opts.Burst); err != nil {
				return nil, err
			}
		}
		if opts.AdaptiveOff {
			if err := f.ControlPlane.SetAdaptive(ctx, false); err != nil {
				return nil, fmt.Errorf("start fleet: set-adaptive off: %w", err)
			}
		}
		if opts.Broker {
			if _, err := f.ControlPlane.Ctl(ctx, "account", "import", "--codex-auth", f.LoginAuth); err != nil {
				return nil, fmt.Errorf("start fleet: %w", err)
			}
		}
	}
	for i := range opts.DataPlanes {
		dp, err := f.startDataPlane(ctx, i)
		if err != nil {
			return nil, err
		}
		f.DataPlanes = append(f.DataPlanes, dp)
	}
	return f, nil
}

// baseEnv is the whole environment of every child: nothing is inherited,
// so no OTEL_* exporter, CODEX_HOME or pacing variable leaks in.
func baseEnv(dir string) []string {
	env := []string{"HOME=" + dir, "TMPDIR=" + os.TempDir()}
	if p, ok := os.LookupEnv("PATH"); ok {
		env = append(env, "PATH="+p)
	}
	return env
}

var simReady = regexp.MustCompile(`^ws://(127\.0\.0\.1:[0-9]+)/`)

func (f *Fleet) startSim(ctx context.Context) error {
	o := f.opts
	args := []string{
		"--listen", "127.0.0.1:0",
		"--accept-token", Token + "=" + Account,
		"--upgrade-limit", strconv.Itoa(o.UpgradeLimit),
		"--upgrade-window", o.UpgradeWindow.String(),
		"--log-level", "warn",
	}
	if o.TokenTTL > 0 {
		args = append(args, "--token-ttl", o.TokenTTL.String())
	}
	if o.Broker {
		f.LoginAuth = filepath.Join(o.Dir, "login", "auth.json")
		if err := os.MkdirAll(filepath.Dir(f.LoginAuth), 0o700); err != nil {
			return fmt.Errorf("start clodex-sim: %w", err)
		}
		args = append(args, "--write-auth", f.LoginAuth, "--auth-account", Account, "--log-level", "info")
	}
	p, addr, err := startProc(ctx, "clodex-sim", o.Bins.Sim, args, f.env, filepath.Join(o.Dir, "sim.log"), simReady, o.ReadyTimeout)
	if err != nil {
		return err
	}
	f.Sim = &Sim{p: p, URL: "http://" + addr, WSURL: "ws://" + addr + codexsim.ChatGPTPath}
	f.log.Info("clodex-sim ready", "url", f.Sim.URL, "upgrade_limit", o.UpgradeLimit, "upgrade_window", o.UpgradeWindow)
	return nil
}

var redisReady = regexp.MustCompile(`Ready to accept connections`)

// startRedis runs redis-server on a free loopback port, without
// persistence, for the replicas to share.
func (f *Fleet) startRedis(ctx context.Context) error {
	o := f.opts
	bin := o.Bins.RedisServer
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("redis-server"); err != nil {
			return fmt.Errorf("start redis-server for %d control-plane replicas: %w (apt-get install redis-server)", o.Replicas, err)
		}
	}
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(addr)
	dir := filepath.Join(o.Dir, "redis")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}
	p, _, err := startProc(ctx, "redis-server", bin, args, f.env, filepath.Join(o.Dir, "redis.log"), redisReady, o.ReadyTimeout)
	if err != nil {
		return err
	}
	f.redis, f.redisURL = p, "redis://"+addr
	f.log.Info("redis-server ready", "addr", addr)
	return nil
}

// startControlPlane starts control plane i: the only one, on the memory
// store, or replica i over the fleet's Redis. Replicas share the tokens.
func (f *Fleet) startControlPlane(ctx context.Context, i int) error {
	o := f.opts
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	cp := &ControlPlane{
		f:          f,
		Addr:       addr,
		adminToken: filepath.Join(o.Dir, "admin.token"),
		agentToken: filepath.Join(o.Dir, "agent.token"),
		dataDir:    filepath.Join(o.Dir, "controlplane"),
	}
	if f.redisURL != "" {
		cp.replica = fmt.Sprintf("cp-%d", i)
	}
	if o.ControlPlaneAdmin {
		if cp.AdminAddr, err = freeAddr(); err != nil {
			return err
		}
	}
	if i == 0 {
		for _, path := range []string{cp.adminToken, cp.agentToken} {
			if err := atomicfile.WriteFile(path, []byte(randomToken()+"\n"), 0o600); err != nil {
				return fmt.Errorf("start control plane: %w", err)
			}
		}
		if o.Broker {
			key := make([]byte, 32)
			_, _ = rand.Read(key)
			f.CredentialKey = filepath.Join(o.Dir, "credential.key")
			if err := atomicfile.WriteFile(f.CredentialKey, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
				return fmt.Errorf("start control plane: %w", err)
			}
		}
		f.ControlPlane = cp
	}
	f.ControlPlanes = append(f.ControlPlanes, cp)
	return cp.start(ctx)
}

// controlPlaneAddrs is the data planes' --control-plane value: every
// replica's address.
func (f *Fleet) controlPlaneAddrs() string {
	addrs := make([]string, len(f.ControlPlanes))
	for i, cp := range f.ControlPlanes {
		addrs[i] = cp.Addr
	}
	return strings.Join(addrs, ",")
}

// start runs the control plane process and waits until it answers an
// admin call.
func (cp *ControlPlane) start(ctx context.Context) error {
	o := cp.f.opts
	args := []string{
		"--listen", cp.Addr,
		"--admin-token-file", cp.adminToken,
		"--agent-token-file", cp.agentToken,
		"--log-level", "info",
	}
	name := "controlplane"
	if cp.replica != "" {
		args = append(args, "--redis", cp.f.redisURL, "--replica", cp.replica)
		name = cp.replica
	} else {
		args = append(args, "--data-dir", cp.dataDir)
	}
	if cp.AdminAddr != "" {
		args = append(args, "--admin-listen", cp.AdminAddr)
	}
	if o.Broker {
		args = append(args, "--credential-key-file", cp.f.CredentialKey, "--token-endpoint", cp.f.Sim.URL+"/oauth/token")
	}
	logPath := filepath.Join(o.Dir, fmt.Sprintf("%s.%d.log", name, cp.restarts))
	p, _, err := startProc(ctx, "clodex-controlplane", o.Bins.ControlPlane, args, cp.f.env, logPath, nil, 0)
	if err != nil {
		return err
	}
	cp.p = p
	// Ready when an admin RPC answers (accounts needs no stored account).
	deadline := time.Now().Add(o.ReadyTimeout)
	for {
		_, err := cp.Ctl(ctx, "accounts")
		if err == nil {
			break
		}
		if p.exited() {
			return fmt.Errorf("start clodex-controlplane: exited (%v); log %s:\n%s", p.waitErr, logPath, tail(logPath))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.kill()
			return fmt.Errorf("start clodex-controlplane: not answering after %v: %w; log %s:\n%s", o.ReadyTimeout, err, logPath, tail(logPath))
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			p.kill()
			return err
		}
	}
	cp.f.log.Info("clodex-controlplane ready", "addr", cp.Addr, "admin", cp.AdminAddr, "start", cp.restarts)
	return nil
}

// RedisURL is the replicas' Redis ("" with one control plane).
func (f *Fleet) RedisURL() string { return f.redisURL }

// AgentTokenFile is the fleet's agent token file.
func (cp *ControlPlane) AgentTokenFile() string { return cp.agentToken }

// DataDir is the control plane's --data-dir (unused over Redis).
func (cp *ControlPlane) DataDir() string { return cp.dataDir }

// Kill sends SIGKILL to the control plane and waits for it to die.
func (cp *ControlPlane) Kill() {
	if cp.p != nil {
		cp.p.kill()
	}
}

// Restart starts the control plane again on the same address and data
// directory (after Kill).
func (cp *ControlPlane) Restart(ctx context.Context) error {
	cp.Kill()
	cp.restarts++
	return cp.start(ctx)
}

// Ctl runs clodexctl against this control plane with the admin token and
// returns its stdout.
func (cp *ControlPlane) Ctl(ctx context.Context, args ...string) ([]byte, error) {
	full := append([]string{"--control-plane", cp.Addr, "--token-file", cp.adminToken, "--timeout", "3s"}, args...)
	out, err := runOut(ctx, 10*time.Second, cp.f.opts.Bins.Ctl, full, cp.f.env)
	if err != nil {
		return out, fmt.Errorf("clodexctl %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}

// AccountView is the part of `clodexctl get -o json` the fleet reads.
type AccountView struct {
	RatePerMinute          int     `json:"rate_per_minute"`
	EffectiveRatePerMinute *int    `json:"effective_rate_per_minute"` // nil when the control plane does not report it
	Burst                  int     `json:"burst"`
	Tokens                 float64 `json:"tokens"`
	PolicyVersion          int64   `json:"policy_version"`
}

// SetRate sets the fleet account's rate and burst.
func (cp *ControlPlane) SetRate(ctx context.Context, rate, burst int) (AccountView, error) {
	return cp.account(ctx, "set-rate", Account, strconv.Itoa(rate), "--burst", strconv.Itoa(burst), "-o", "json")
}

// Get reads the fleet account.
func (cp *ControlPlane) Get(ctx context.Context) (AccountView, error) {
	return cp.account(ctx, "get", Account, "-o", "json")
}

func (cp *ControlPlane) account(ctx context.Context, args ...string) (AccountView, error) {
	out, err := cp.Ctl(ctx, args...)
	if err != nil {
		return AccountView{}, err
	}
	var v AccountView
	if err := json.Unmarshal(out, &v); err != nil {
		return AccountView{}, fmt.Errorf("clodexctl %s: decode output: %w", args[0], err)
	}
	return v, nil
}

// AgentView is the part of `clodexctl agents -o json` the fleet reads.
type AgentView struct {
	ID       string   `json:"id"`
	Host     string   `json:"host"`
	Accounts []string `json:"accounts"`
	LastSeen string   `json:"last_seen"`
	Live     *bool    `json:"live"`
}

// Agents lists the agents the control plane knows.
func (cp *ControlPlane) Agents(ctx context.Context) ([]AgentView, error) {
	out, err := cp.Ctl(ctx, "agents", "-o", "json")
	if err != nil {
		return nil, err
	}
	var v []AgentView
	if err := json.Unmarshal(out, &v); err != nil {
		return nil, fmt.Errorf("clodexctl agents: decode output: %w", err)
	}
	return v, nil
}

// Metric sums every sample of the named metric on the control plane's
// /metrics (the current process: counters restart at zero with it).
func (cp *ControlPlane) Metric(ctx context.Context, client *http.Client, name string) (float64, error) {
	if cp.AdminAddr == "" {
		return 0, errors.New("read control plane metric: the admin listener is off (Options.ControlPlaneAdmin)")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+cp.AdminAddr+"/metrics", nil)
	if err != nil {
		return 0, fmt.Errorf("read control plane metric: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("read control plane metric: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("read control plane metric: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("read control plane metric: GET /metrics: %s", resp.Status)
	}
	return SumMetric(body, name), nil
}

// SumMetric sums the samples of one metric in a Prometheus text
// exposition: lines "name value" and "name{labels} value".
func SumMetric(exposition []byte, name string) float64 {
	var sum float64
	for _, line := range bytes.Split(exposition, []byte("\n")) {
		s := string(line)
		if !strings.HasPrefix(s, name) {
			continue
		}
		rest := s[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // a longer name with this prefix
		}
		if rest[0] == '{' {
			i := strings.LastIndexByte(rest, '}')
			if i < 0 {
				continue
			}
			rest = rest[i+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
			sum += v
		}
	}
	return sum
}

var dataPlaneReady = regexp.MustCompile(`ANTHROPIC_BASE_URL=(http://127\.0\.0\.1:[0-9]+)`)

func (f *Fleet) startDataPlane(ctx context.Context, i int) (*DataPlane, error) {
	o := f.opts
	home := filepath.Join(o.Dir, fmt.Sprintf("dp%d", i))
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, fmt.Errorf("start data plane %d: %w", i, err)
	}
	authPath := filepath.Join(home, "auth.json")
	if err := atomicfile.WriteFile(authPath, AuthJSON(Token, Account), 0o600); err != nil {
		return nil, fmt.Errorf("start data plane %d: %w", i, err)
	}
	args := []string{
		"--listen", "127.0.0.1:0",
		"--upstream-url", f.Sim.WSURL,
		"--log-level", "info",
	}
	if !o.Broker { // with the broker, no auth.json: tokens come from the control plane
		args = append(args, "--codex-auth", authPath)
	}
	env := append([]string(nil), f.env...)
	env[0] = "HOME=" + home
	switch o.Mode {
	case Central:
		args = append(args, "--control-plane", f.controlPlaneAddrs(), "--agent-token-file", f.ControlPlane.agentToken)
	case PerHost:
		env = append(env, "CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN="+strconv.Itoa(o.Rate))
	}
	if f.refreshFlag && !o.Broker {
		args = append(args, "--refresh=never") // the emulator's token never expires; nothing to refresh
	}
	args = append(args, o.DataPlaneArgs...)
	logPath := filepath.Join(o.Dir, fmt.Sprintf("dataplane%d.log", i))
	p, base, err := startProc(ctx, fmt.Sprintf("clodex-dataplane %d", i), o.Bins.DataPlane, args, env, logPath, dataPlaneReady, o.ReadyTimeout)
	if err != nil {
		return nil, err
	}
	f.log.Info("clodex-dataplane ready", "n", i, "url", base, "mode", o.Mode)
	return &DataPlane{p: p, BaseURL: base, Log: logPath}, nil
}

// AuthJSON is a Codex CLI auth.json (ChatGPT mode) holding an opaque
// access token and the account id.
func AuthJSON(token, account string) []byte {
	b, _ := json.MarshalIndent(map[string]any{
		"auth_mode":      "chatgpt",
		"OPENAI_API_KEY": nil,
		"tokens": map[string]string{
			"id_token":      "",
			"access_token":  token,
			"refresh_token": "",
			"account_id":    account,
		},
		"last_refresh": time.Now().UTC().Format(time.RFC3339),
	}, "", "  ")
	return append(b, '\n')
}

// Stats reads clodex-sim's counters.
func (s *Sim) Stats(ctx context.Context, client *http.Client) (codexsim.Stats, error) {
	var st codexsim.Stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+codexsim.StatsPath, nil)
	if err != nil {
		return st, fmt.Errorf("read sim stats: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return st, fmt.Errorf("read sim stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("read sim stats: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("read sim stats: %w", err)
	}
	return st, nil
}

// Configure changes clodex-sim's running knobs (POST /sim/config); patch
// is a codexsim.ConfigPatch as JSON, e.g. {"upgrade_limit":2}.
func (s *Sim) Configure(ctx context.Context, client *http.Client, patch string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+codexsim.ConfigPath, strings.NewReader(patch))
	if err != nil {
		return fmt.Errorf("configure sim: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("configure sim: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return fmt.Errorf("configure sim: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// Close stops the data planes (SIGTERM, then SIGKILL after 5 s), the
// control plane and the emulator.
func (f *Fleet) Close() {
	for _, dp := range f.DataPlanes {
		dp.p.signal(syscall.SIGTERM)
	}
	for _, dp := range f.DataPlanes {
		dp.p.stop(5 * time.Second)
	}
	for _, cp := range f.ControlPlanes {
		if cp.p != nil {
			cp.p.stop(5 * time.Second)
		}
	}
	if f.redis != nil {
		f.redis.stop(5 * time.Second)
	}
	if f.Sim != nil {
		f.Sim.p.stop(5 * time.Second)
	}
}

// Logs names the fleet's log files, for a failure report.
func (f *Fleet) Logs() []string {
	m, _ := filepath.Glob(filepath.Join(f.opts.Dir, "*.log"))
	return m
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SetAdaptive turns the fleet account's adaptive mode on or off.
func (cp *ControlPlane) SetAdaptive(ctx context.Context, on bool) error {
	v := "off"
	if on {
		v = "on"
	}
	_, err := cp.Ctl(ctx, "set-adaptive", Account, v)
	return err
}
