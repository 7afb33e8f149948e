package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

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
	// RedisAOF runs the replicas' redis-server with appendonly yes
	// (appendfsync everysec) in its directory, so a restart reads its data
	// back (Fleet.RedisRestart). (Optional; default no persistence)
	RedisAOF bool
	// Backups gives every control-plane replica a --backup-dir of its own
	// (ControlPlane.BackupDir). (Optional)
	Backups bool
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
	redisAddr   string
	redisDir    string
	redisRuns   int
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
