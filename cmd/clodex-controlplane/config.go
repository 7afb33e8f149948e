package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/controlplane/console"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/memlimit"
	"github.com/clodex/clodex/internal/pacing"
	"github.com/clodex/clodex/internal/telemetry"
)

// Environment variables read by loadConfig (the only place that reads the
// environment).
const (
	envListen         = "CLODEX_CONTROLPLANE_LISTEN"
	envDataDir        = "CLODEX_DATA_DIR"
	envAdminToken     = "CLODEX_ADMIN_TOKEN"
	envAgentToken     = "CLODEX_AGENT_TOKEN"
	envAdminTokenFile = "CLODEX_ADMIN_TOKEN_FILE"
	envAgentTokenFile = "CLODEX_AGENT_TOKEN_FILE"
	envAdminListen    = "CLODEX_CONTROLPLANE_ADMIN_LISTEN"
	envConsoleURL     = "CLODEX_CONTROLPLANE_CONSOLE_URL"
	envMetricsToken   = "CLODEX_METRICS_TOKEN_FILE"
	envRedis          = "CLODEX_REDIS_URL"
	envReplica        = "CLODEX_CONTROLPLANE_REPLICA"
	envCredentialKey  = "CLODEX_CREDENTIAL_KEY_FILE"
	envTokenEndpoint  = "CLODEX_TOKEN_ENDPOINT"
	envBackupDir      = "CLODEX_BACKUP_DIR"
)

const defaultListen = "127.0.0.1:17700"

// config is the control plane's configuration, loaded once in run.
type config struct {
	// Listen is the gRPC listen address. (Optional; default 127.0.0.1:17700)
	Listen string
	// DataDir holds policy.json. (Required without Redis)
	DataDir string
	// Redis, when set, serves from Redis at this URL (redis://, rediss://,
	// or a Sentinel URL with master_name) as one replica among any number.
	// (Optional; default the memory store)
	Redis string
	// RedisPrefix prefixes every Redis key. (Optional; default "clodex:")
	RedisPrefix string
	// RedisTimeout is the shortest deadline of a Redis call; the deadline
	// follows observed latency (4 x the slowest call of the last 10 s) up
	// to RedisMaxTimeout. (Optional; default 100ms)
	RedisTimeout time.Duration
	// RedisMaxTimeout is the longest deadline of a Redis call. (Optional;
	// default 1s)
	RedisMaxTimeout time.Duration
	// Replica names this replica in Redis. (Optional; default
	// hostname-random)
	Replica string
	// AdminTokenFile holds the admin token. (Required unless
	// CLODEX_ADMIN_TOKEN is set)
	AdminTokenFile string
	// AgentTokenFile holds the agent token. (Required unless
	// CLODEX_AGENT_TOKEN is set)
	AgentTokenFile string
	// AdminTokenEnv and AgentTokenEnv are the tokens from the environment,
	// used when no file is given.
	AdminTokenEnv, AgentTokenEnv string
	// AdminListen serves /metrics, /debug/ and, with Pprof, /debug/pprof.
	// (Optional; default off) A non-loopback address requires
	// MetricsTokenFile.
	AdminListen string
	// CredentialKeyFile holds the credential broker's key: 32 random bytes
	// in base64, mode 0600. With it the control plane holds the accounts'
	// logins (sealed in the data dir's logins.json, or in Redis) and is
	// their only refresher. (Optional; default off: no broker)
	CredentialKeyFile string
	// BackupDir keeps this replica's sealed backups of the durable state
	// (policies, sign-ins, agent credentials): one after every change, the
	// newest 10 kept; a store found empty at start is restored from the
	// newest. (Optional; default none)
	BackupDir string
	// RotateKeyFile, with CredentialKeyFile, re-seals every sign-in under
	// the key in this file, then exits. (Optional)
	RotateKeyFile string
	// TokenEndpoint is the OAuth token endpoint the broker refreshes at.
	// (Optional; default https://auth.openai.com/oauth/token)
	TokenEndpoint string
	// MetricsTokenFile holds the bearer token every AdminListen request
	// must carry. (Required when AdminListen is not loopback)
	MetricsTokenFile string
	// Pprof serves /debug/pprof on AdminListen. (Optional; default off)
	Pprof bool
	// MemberMetrics exports the usage counters by member and account too
	// (clodex_controlplane_usage_member_*_total). (Optional; default off:
	// by account and agent only)
	MemberMetrics bool
	// ConsoleURL is the web console's base URL as browsers reach it
	// (scheme and host), put in the sign-in links clodexctl console
	// prints. (Optional; default http:// and the admin listener's address,
	// with localhost for an unspecified host)
	ConsoleURL string
	// TLSCert and TLSKey enable TLS; ClientCA requires client
	// certificates. (Optional; default plaintext)
	TLSCert, TLSKey, ClientCA string
	// DefaultRate and DefaultBurst override the default policy's rate and
	// burst for accounts without a stored policy. (Optional; default from
	// CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN and the budget variables, else
	// 60/min, burst 10)
	DefaultRate, DefaultBurst int
	setRate, setBurst         bool
	// ShutdownGrace bounds GracefulStop before Stop. (Optional; default 5s)
	ShutdownGrace time.Duration
	// ColdStart is how long after start new buckets start empty (store
	// Options.ColdStart), memory store only. (Optional; default 0: buckets
	// start full; data planes hand over the grants they made while the
	// control plane was down.)
	ColdStart time.Duration
	// DrainDelay is the wait between health NOT_SERVING and stopping.
	// (Optional; default 0)
	DrainDelay time.Duration
	// MaxAgentAccounts bounds the accounts one agent credential may
	// register. (Optional; default 1000)
	MaxAgentAccounts int
	// BenchService registers the benchmark's no-op service. (Optional;
	// default false)
	BenchService bool
	// MemoryLimit is the soft memory limit: auto (GOMEMLIMIT, else 0.9
	// of the cgroup's memory limit), off, or a size such as 400MiB.
	// (Optional; default auto)
	MemoryLimit string
	// LogLevel is debug, info, warn or error. (Optional; default info)
	LogLevel string
	// LogFormat is text or json. (Optional; default text)
	LogFormat string
	// CheckConfig validates the configuration and exits.
	CheckConfig bool
	// Version prints the version and exits.
	Version bool

	// Defaults is the resolved default policy and the notices resolving it
	// produced (filled by loadConfig).
	Defaults pacing.Policy
	Notices  []pacing.Notice
}

// errHelp is returned for -h/--help after the usage was printed.
var errHelp = flag.ErrHelp

// loadConfig parses args and the environment.
func loadConfig(args []string, lookupEnv func(string) (string, bool), stdout io.Writer) (*config, error) {
	env := func(k string) string {
		v, _ := lookupEnv(k)
		return strings.TrimSpace(v)
	}
	or := func(v, def string) string {
		if v != "" {
			return v
		}
		return def
	}
	c := &config{}
	fs := flag.NewFlagSet("clodex-controlplane", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.Listen, "listen", or(env(envListen), defaultListen), "gRPC listen `address` (env "+envListen+")")
	fs.StringVar(&c.DataDir, "data-dir", env(envDataDir), "data `directory` holding policy.json and, with --credential-key-file, logins.json: the memory store, for one control plane (this or --redis is required; with --redis it is not used; env "+envDataDir+")")
	fs.StringVar(&c.Redis, "redis", env(envRedis), "serve from Redis at this `URL` as one of any number of replicas: redis://[user:pass@]host:port[/db], rediss://..., or redis://sentinel:26379?master_name=NAME&addr=sentinel2:26379 (env "+envRedis+", which keeps a password out of the process list)")
	fs.StringVar(&c.RedisPrefix, "redis-prefix", "clodex:", "`prefix` of every Redis key and channel")
	fs.DurationVar(&c.RedisTimeout, "redis-timeout", 100*time.Millisecond, "shortest deadline of a Redis call (1ms..5s); it follows observed latency (4 x the slowest call of the last 10 s) up to --redis-max-timeout; past it, or with Redis down, this replica admits from its share of the policy")
	fs.DurationVar(&c.RedisMaxTimeout, "redis-max-timeout", time.Second, "longest deadline of a Redis call (at least --redis-timeout, at most 30s)")
	fs.StringVar(&c.Replica, "replica", env(envReplica), "this replica's `id` in Redis (default hostname-random; env "+envReplica+")")
	fs.StringVar(&c.AdminTokenFile, "admin-token-file", env(envAdminTokenFile), "`file` holding the admin token (or env "+envAdminToken+")")
	fs.StringVar(&c.AgentTokenFile, "agent-token-file", env(envAgentTokenFile), "`file` holding the agent token (or env "+envAgentToken+")")
	fs.StringVar(&c.CredentialKeyFile, "credential-key-file", env(envCredentialKey), "run the credential broker with the key in this `file`: 32 random bytes in base64 (head -c 32 /dev/urandom | base64), mode 0600; logins are sealed with it (env "+envCredentialKey+")")
	fs.StringVar(&c.BackupDir, "backup-dir", env(envBackupDir), "keep sealed backups of the durable state (policies, sign-ins, agent credentials) in this `directory`: one after every change, the newest 10; a store found empty at start is restored from the newest (env "+envBackupDir+")")
	fs.StringVar(&c.RotateKeyFile, "rotate-credential-key", "", "re-seal every sign-in under the key in this `file` (the --credential-key-file's successor), without a refresh, then exit; restart every replica with it as --credential-key-file")
	fs.StringVar(&c.TokenEndpoint, "token-endpoint", or(env(envTokenEndpoint), codexauth.DefaultTokenEndpoint), "OAuth token `URL` the credential broker refreshes at (env "+envTokenEndpoint+")")
	fs.StringVar(&c.AdminListen, "admin-listen", env(envAdminListen), "serve /metrics, /debug/ and, with --pprof, /debug/pprof on this `address` (default off; non-loopback needs --metrics-token-file)")
	fs.StringVar(&c.MetricsTokenFile, "metrics-token-file", env(envMetricsToken), "`file` holding the bearer token every --admin-listen request must carry (required off loopback; env "+envMetricsToken+")")
	fs.BoolVar(&c.Pprof, "pprof", false, "serve /debug/pprof on --admin-listen")
	fs.BoolVar(&c.MemberMetrics, "member-metrics", false, "export the usage counters by member and account too (one series set per member; off: by account and agent only)")
	fs.StringVar(&c.ConsoleURL, "console-url", env(envConsoleURL), "the web console's base `URL` as browsers reach it, e.g. https://clodex.example.com (default http:// and --admin-listen's address; env "+envConsoleURL+")")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "server certificate PEM `file` (with --tls-key; default plaintext)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "server key PEM `file`")
	fs.StringVar(&c.ClientCA, "client-ca", "", "require client certificates signed by this CA PEM `file`")
	fs.Func("default-rate", "rate per minute for accounts without a stored policy, 0..600 (default from "+pacing.EnvRate+", else 60)", intFlag(&c.DefaultRate, &c.setRate, "0..600"))
	fs.Func("default-burst", "burst for accounts without a stored policy, 1..1000 (default 10)", intFlag(&c.DefaultBurst, &c.setBurst, "1..1000"))
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 5*time.Second, "bound on graceful stop before connections are closed")
	fs.DurationVar(&c.ColdStart, "cold-start", 0, "memory store: after start, new buckets start empty for this long, an explicit stand-in for grants made while this control plane was down (0..10m; default 0: full buckets, grants are handed over)")
	fs.DurationVar(&c.DrainDelay, "drain-delay", 0, "wait after marking health NOT_SERVING before stopping")
	fs.IntVar(&c.MaxAgentAccounts, "max-agent-accounts", 1000, "most accounts one agent credential may register (1..1000000); Admit refuses an account no operator configured and no registered data plane serves")
	fs.StringVar(&c.MemoryLimit, "memory-limit", "auto", "soft memory `limit` of the Go runtime: auto (GOMEMLIMIT when set, else 0.9 of the cgroup's memory.max or memory.limit_in_bytes, else none), off, or a size such as 400MiB or 1GiB")
	fs.BoolVar(&c.BenchService, "bench-service", false, "register the benchmark's no-op BenchService")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log `level`: debug, info, warn, error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log `format`: text, json")
	fs.BoolVar(&c.CheckConfig, "check-config", false, "validate the configuration and exit")
	fs.BoolVar(&c.Version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "Usage: clodex-controlplane (--data-dir DIR | --redis URL) --admin-token-file FILE --agent-token-file FILE [flags]")
			fmt.Fprintln(stdout, "\nOne control plane keeps its state in --data-dir; any number of replicas share one Redis (--redis, or "+envRedis+") and need no data dir.")
			fmt.Fprintln(stdout, "\nFlags:")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil, errHelp
		}
		return nil, fmt.Errorf("%w (run with --help for the flags)", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q; clodex-controlplane takes only flags (run with --help)", fs.Arg(0))
	}
	c.AdminTokenEnv = env(envAdminToken)
	c.AgentTokenEnv = env(envAgentToken)

	c.Defaults, c.Notices = pacing.PolicyFromEnv(lookupEnv)
	if c.setRate {
		c.Defaults.RatePerMinute = c.DefaultRate
	}
	if c.setBurst {
		c.Defaults.Burst = c.DefaultBurst
	}
	return c, nil
}

func intFlag(dst *int, set *bool, allowed string) func(string) error {
	return func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("not an integer; allowed %s", allowed)
		}
		*dst, *set = n, true
		return nil
	}
}

// Validate reports every problem at once, each naming the flag and what is
// allowed.
func (c *config) Validate() error {
	var errs []error
	if c.DataDir == "" && c.Redis == "" {
		errs = append(errs, fmt.Errorf("--data-dir is required (or %s), or --redis", envDataDir))
	}
	if c.Redis != "" {
		if c.ColdStart != 0 {
			errs = append(errs, errors.New("--cold-start applies to the memory store only; with --redis the buckets live in Redis and survive a replica's restart"))
		}
		if c.RedisTimeout < time.Millisecond || c.RedisTimeout > 5*time.Second {
			errs = append(errs, fmt.Errorf("--redis-timeout %v is out of range; allowed 1ms..5s", c.RedisTimeout))
		}
		if c.RedisMaxTimeout < c.RedisTimeout || c.RedisMaxTimeout > 30*time.Second {
			errs = append(errs, fmt.Errorf("--redis-max-timeout %v is out of range; allowed --redis-timeout (%v)..30s", c.RedisMaxTimeout, c.RedisTimeout))
		}
		if c.RedisPrefix == "" || strings.ContainsAny(c.RedisPrefix, " \t\r\n") {
			errs = append(errs, fmt.Errorf("--redis-prefix %q is invalid; want a non-empty prefix without spaces, such as %q", c.RedisPrefix, "clodex:"))
		}
		if err := validReplica(c.Replica); err != nil {
			errs = append(errs, err)
		}
	}
	if c.RotateKeyFile != "" && c.CredentialKeyFile == "" {
		errs = append(errs, errors.New("--rotate-credential-key needs --credential-key-file, the key the sign-ins are sealed with now"))
	}
	if c.RotateKeyFile != "" && c.CheckConfig {
		errs = append(errs, errors.New("--rotate-credential-key and --check-config are separate runs; give one of them"))
	}
	if err := broker.CheckEndpoint(c.TokenEndpoint); err != nil {
		errs = append(errs, fmt.Errorf("--token-endpoint: %w", err))
	}
	if c.AdminTokenFile == "" && c.AdminTokenEnv == "" {
		errs = append(errs, fmt.Errorf("--admin-token-file or %s is required", envAdminToken))
	}
	if c.AgentTokenFile == "" && c.AgentTokenEnv == "" {
		errs = append(errs, fmt.Errorf("--agent-token-file or %s is required", envAgentToken))
	}
	if err := validAddr("--listen", c.Listen); err != nil {
		errs = append(errs, err)
	}
	if c.AdminListen != "" {
		if err := validAddr("--admin-listen", c.AdminListen); err != nil {
			errs = append(errs, err)
		}
	}
	if err := telemetry.CheckAdminFlags(c.AdminListen, c.MetricsTokenFile, c.Pprof); err != nil {
		errs = append(errs, err)
	}
	if c.ConsoleURL != "" {
		if c.AdminListen == "" {
			errs = append(errs, errors.New("--console-url is set but --admin-listen is not: the console is served on the admin listener"))
		} else if _, err := console.NewLinks(c.ConsoleURL, nil); err != nil {
			errs = append(errs, fmt.Errorf("--console-url: %w", err))
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key must be given together"))
	}
	if c.ClientCA != "" && c.TLSCert == "" {
		errs = append(errs, errors.New("--client-ca needs --tls-cert and --tls-key"))
	}
	if c.setRate {
		if err := pacing.ValidateRate(c.DefaultRate); err != nil {
			errs = append(errs, fmt.Errorf("--default-rate: %w", err))
		}
	}
	if c.setBurst {
		if err := pacing.ValidateBurst(c.DefaultBurst); err != nil {
			errs = append(errs, fmt.Errorf("--default-burst: %w", err))
		}
	}
	if c.MaxAgentAccounts < 1 || c.MaxAgentAccounts > 1000000 {
		errs = append(errs, fmt.Errorf("--max-agent-accounts %d is out of range; allowed 1..1000000", c.MaxAgentAccounts))
	}
	if c.ShutdownGrace <= 0 || c.ShutdownGrace > time.Minute {
		errs = append(errs, fmt.Errorf("--shutdown-grace %v is out of range; allowed 1ms..1m", c.ShutdownGrace))
	}
	if c.ColdStart < 0 || c.ColdStart > 10*time.Minute {
		errs = append(errs, fmt.Errorf("--cold-start %v is out of range; allowed 0..10m", c.ColdStart))
	}
	if c.DrainDelay < 0 || c.DrainDelay > time.Minute {
		errs = append(errs, fmt.Errorf("--drain-delay %v is out of range; allowed 0..1m", c.DrainDelay))
	}
	if _, err := memlimit.Parse(c.MemoryLimit); err != nil {
		errs = append(errs, fmt.Errorf("--memory-limit: %w", err))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("--log-format %q is invalid; allowed text, json", c.LogFormat))
	}
	return joinLine(errs)
}

// lineErrors joins several errors on one line, so a bad configuration is
// one clear line however many problems it has.
type lineErrors []error

func (e lineErrors) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e lineErrors) Unwrap() []error { return e }

func joinLine(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return lineErrors(errs)
}

func validReplica(id string) error {
	if len(id) > 128 {
		return fmt.Errorf("--replica is %d bytes; allowed 1..128 printable ASCII bytes without spaces", len(id))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("--replica %q has a byte 0x%02x at %d; allowed printable ASCII without spaces", id, c, i)
		}
	}
	return nil
}

func validAddr(flagName, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q is invalid; want host:port such as 127.0.0.1:17700", flagName, addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%s %q has an invalid port; allowed 0..65535", flagName, addr)
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("--log-level %q is invalid; allowed debug, info, warn, error", s)
}

// metricsToken reads --metrics-token-file ("" when it is not set), with a
// warning when its mode lets others read it (as tokens does).
func (c *config) metricsToken() (token, warning string, err error) {
	if c.MetricsTokenFile == "" {
		return "", "", nil
	}
	tok, warning, err := bearer.ReadFile(c.MetricsTokenFile)
	if err != nil {
		return "", "", fmt.Errorf("--metrics-token-file: %w", err)
	}
	if warning != "" {
		warning = "--metrics-token-file: " + warning
	}
	return tok.Reveal(), warning, nil
}

// tokens loads the admin and agent tokens: from their files when given,
// else from the environment. Warnings (loose file modes) are returned
// for the caller to log; they never contain a token.
func (c *config) tokens() (admin, agent bearer.Token, warnings []string, err error) {
	load := func(name, file, envValue string) (bearer.Token, error) {
		if file != "" {
			tok, warn, err := bearer.ReadFile(file)
			if err != nil {
				return bearer.Token{}, fmt.Errorf("%s token: %w", name, err)
			}
			if warn != "" {
				warnings = append(warnings, warn)
			}
			return tok, nil
		}
		tok, err := bearer.Parse(envValue)
		if err != nil {
			return bearer.Token{}, fmt.Errorf("%s token from the environment: %w", name, err)
		}
		return tok, nil
	}
	admin, err1 := load("admin", c.AdminTokenFile, c.AdminTokenEnv)
	agent, err2 := load("agent", c.AgentTokenFile, c.AgentTokenEnv)
	if err := errors.Join(err1, err2); err != nil {
		return admin, agent, warnings, err
	}
	if admin.Equal(agent) {
		return admin, agent, warnings, errors.New("the admin and agent tokens are the same; they must differ")
	}
	return admin, agent, warnings, nil
}
