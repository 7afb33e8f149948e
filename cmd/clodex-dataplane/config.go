package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/node"
	"github.com/clodex/clodex/internal/pacing"
)

// Environment variables read by loadConfig, the only place that reads the
// environment. The pacing and budget variables (pacing.EnvRate, …) and the
// pool caps (pool.EnvMaxConnections, …) are read there too, through their
// packages' parsers.
const (
	envCodexHome      = "CODEX_HOME" // Codex CLI's home; auth.json lives there
	envHome           = "HOME"
	envAgentToken     = node.EnvAgentToken        // the fleet's agent token, when no file is given
	envAgentTokenFile = "CLODEX_AGENT_TOKEN_FILE" // default of --agent-token-file
	envUsageLimitHold = "CLODEX_USAGE_LIMIT_HOLD" // default of --usage-limit-hold
	envMemberKeys     = "CLODEX_MEMBER_KEYS"      // default of --member-keys: true or false
)

// osLookupEnv is the process environment; run hands it to loadConfig.
var osLookupEnv = os.LookupEnv

// config is the command line: the data plane's configuration, and
// --version.
type config struct {
	node.Config
	// Version prints the version and exits.
	Version bool
}

// usageError is a bad command line; main exits 2 for it (and for a
// *node.ConfigError).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// loadConfig parses args and the environment (through lookupEnv) into a
// validated config. Every flag's default is filled in, so the config says
// what runs.
func loadConfig(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*config, error) {
	getenv := func(k string) string { v, _ := lookupEnv(k); return v }
	c := &config{Config: node.Config{LookupEnv: lookupEnv, Version: version}}
	fs := flag.NewFlagSet("clodex-dataplane", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Listen, "listen", node.DefaultListen, "`address` of the Anthropic API listener (non-loopback needs --api-key-file)")
	fs.StringVar(&c.UpstreamURL, "upstream-url", upstream.DefaultURL, "Codex Responses WebSocket `URL` (ws:// or wss://)")
	fs.Var(&codexAuthFlag{c: &c.Config}, "codex-auth", "Codex CLI auth.json `file` with the ChatGPT sign-in; repeat it to serve several accounts, new conversations going to the one with the most headroom (default $CODEX_HOME/auth.json or ~/.codex/auth.json; with --control-plane, none: access tokens come from the control plane's credential broker)")
	fs.StringVar(&c.TokenEndpoint, "token-endpoint", codexauth.DefaultTokenEndpoint, "OAuth token endpoint `URL` used to refresh --codex-auth")
	fs.StringVar(&c.Refresh, "refresh", "", "refresh --codex-auth before it expires: `auto` or never (default auto; never with --control-plane)")
	fs.StringVar(&c.AdminListen, "admin-listen", "", "`address` for /metrics, /debug/ and, with --pprof, /debug/pprof (default off; non-loopback needs --metrics-token-file)")
	fs.StringVar(&c.MetricsTokenFile, "metrics-token-file", "", "`file` holding the bearer token every --admin-listen request must carry (required off loopback; mode 0600)")
	fs.BoolVar(&c.Pprof, "pprof", false, "serve /debug/pprof on --admin-listen")
	fs.StringVar(&c.APIKeyFile, "api-key-file", "", "`file` whose first line is the API key clients must send (required off loopback, unless --member-keys)")
	memberKeys, memberKeysErr := boolEnv(envMemberKeys, getenv(envMemberKeys))
	fs.BoolVar(&c.MemberKeys, "member-keys", memberKeys, "serve only the keys of the team's members (clodexctl member create), on any listener; needs --control-plane (env "+envMemberKeys+")")
	origins := fs.String("allowed-origins", "", "comma-separated browser `origins` allowed to call the API, e.g. http://localhost:3000")
	fs.StringVar(&c.ModelAliases, "model-aliases", "", "model aliases `pattern=model,...` tried before the defaults (pattern may end in *)")
	fs.BoolVar(&c.ModelPassthrough, "model-passthrough", false, "send model names no alias matches to the backend unchanged (default: answer 400 listing the accepted names)")
	failureRetries := fs.Int("failure-retries", retry.DefaultFailureRetries, "`retries` a turn spends inside the data plane on a failure the client retries itself (5xx, unreachable backend, 429) while the upstream is healthy; 0 leaves them all to the client")
	c.UsageLimitHold = accounts.DefaultUsageLimitHold
	fs.Func("usage-limit-hold", "`duration` an account at its usage limit takes no new conversation when the backend gives no reset time, "+accounts.UsageLimitHoldRange+" (default 5m, or "+envUsageLimitHold+")", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("not a duration; want e.g. 5m or 90s, allowed %s", accounts.UsageLimitHoldRange)
		}
		c.UsageLimitHold = d
		return nil
	})
	fs.StringVar(&c.ControlPlane, "control-plane", "", "join the fleet whose control plane listens at `host:port`: one address (a name may resolve to several replicas), a comma-separated list of replicas a:17700,b:17700, or dns:///host:port; RPCs are balanced over the replicas and fail over on error (default: run one embedded in-process)")
	fs.StringVar(&c.AgentTokenFile, "agent-token-file", getenv(envAgentTokenFile), "`file` holding the fleet's agent token (or set "+envAgentToken+")")
	fs.StringVar(&c.TLSCA, "tls-ca", "", "verify the control plane with this CA PEM `file` (default plaintext)")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "client certificate PEM `file` for the control plane (with --tls-key)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "client key PEM `file` (with --tls-cert)")
	fs.StringVar(&c.DataDir, "data-dir", "", "`directory` where the embedded control plane keeps policy.json (default: policies in memory)")
	fs.StringVar(&c.WSDiagnostics, "ws-diagnostics", "", "append one JSON line per socket decision to `file` (- for stderr; default off)")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", node.DefaultShutdownGrace, "how long in-flight turns may finish on shutdown")
	fs.DurationVar(&c.UsageFlush, "usage-flush", control.DefaultUsageFlush, "how often the turns' usage goes to the control plane's ledger (1s..10m)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.BoolVar(&c.Version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, &usageError{msg: err.Error() + " (see clodex-dataplane --help)"}
	}
	if fs.NArg() > 0 {
		return nil, &usageError{msg: fmt.Sprintf("unexpected argument %q; clodex-dataplane takes flags only (see --help)", fs.Arg(0))}
	}
	if c.Version {
		return c, nil
	}
	var errs []error
	if v, ok := lookupEnv(envUsageLimitHold); ok && !flagSet(fs, "usage-limit-hold") {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q is not a duration; want e.g. 5m or 90s, allowed %s", envUsageLimitHold, v, accounts.UsageLimitHoldRange))
		} else if d < accounts.MinUsageLimitHold || d > accounts.MaxUsageLimitHold {
			errs = append(errs, fmt.Errorf("%s=%s is out of range; allowed %s", envUsageLimitHold, v, accounts.UsageLimitHoldRange))
		} else {
			c.UsageLimitHold = d
		}
	}
	if c.UsageLimitHold == 0 { // node.Config reads 0 as the default; Validate checks the rest
		errs = append(errs, fmt.Errorf("--usage-limit-hold %v is out of range; allowed %s", c.UsageLimitHold, accounts.UsageLimitHoldRange))
	}
	if memberKeysErr != nil {
		errs = append(errs, memberKeysErr)
	}
	switch n := *failureRetries; {
	case n == 0:
		c.FailureRetries = retry.NoFailureRetries
	case n < 0:
		errs = append(errs, fmt.Errorf("--failure-retries %d is out of range; allowed: 0..%d", n, pacing.MaxMaxRetries))
	default:
		c.FailureRetries = n
	}
	for _, o := range strings.Split(*origins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			c.AllowedOrigins = append(c.AllowedOrigins, o)
		}
	}
	if c.CodexAuth == "" && c.ControlPlane == "" {
		// In a fleet, no --codex-auth means tokens from the control
		// plane's credential broker.
		c.CodexAuth = defaultCodexAuth(lookupEnv)
	}
	if c.Refresh == "" {
		c.Refresh = node.RefreshAuto
		if c.ControlPlane != "" {
			c.Refresh = node.RefreshNever
		}
	}
	if c.AgentTokenFile == "" {
		c.AgentToken = strings.TrimSpace(getenv(envAgentToken))
	}
	c.Policy, c.Notices = pacing.PolicyFromEnv(lookupEnv)
	c.MaxConnections, c.MaxNurseryConnections = pool.CapsFromEnv(getenv, func(msg string) {
		c.Notices = append(c.Notices, pacing.Notice{Key: "pool.caps:" + msg, Message: msg})
	})
	if c.ShutdownGrace == 0 { // node.Config reads 0 as the default
		errs = append(errs, errors.New("--shutdown-grace 0s must be positive"))
	}
	if err := errors.Join(append(errs, c.Validate())...); err != nil {
		return nil, &usageError{msg: err.Error()}
	}
	return c, nil
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// defaultCodexAuth is $CODEX_HOME/auth.json, else $HOME/.codex/auth.json.
func defaultCodexAuth(lookupEnv func(string) (string, bool)) string {
	if h, ok := lookupEnv(envCodexHome); ok && h != "" {
		return filepath.Join(h, "auth.json")
	}
	if h, ok := lookupEnv(envHome); ok && h != "" {
		return filepath.Join(h, ".codex", "auth.json")
	}
	return filepath.Join(".codex", "auth.json")
}

// codexAuthFlag is --codex-auth, which may be repeated: the first file is
// Config.CodexAuth, the others Config.ExtraCodexAuth.
type codexAuthFlag struct{ c *node.Config }

func (f *codexAuthFlag) String() string {
	if f == nil || f.c == nil {
		return ""
	}
	return strings.Join(append([]string{f.c.CodexAuth}, f.c.ExtraCodexAuth...), ",")
}

func (f *codexAuthFlag) Set(v string) error {
	if f.c.CodexAuth == "" {
		f.c.CodexAuth = v
		return nil
	}
	f.c.ExtraCodexAuth = append(f.c.ExtraCodexAuth, v)
	return nil
}

// boolEnv reads the boolean environment value v of variable name: "" is
// false; true, 1, yes,
// on and false, 0, no, off (any case) are accepted.
func boolEnv(name, v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "false", "0", "no", "off":
		return false, nil
	case "true", "1", "yes", "on":
		return true, nil
	}
	return false, fmt.Errorf("%s=%q is invalid; want true or false", name, v)
}
