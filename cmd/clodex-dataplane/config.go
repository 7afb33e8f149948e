package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
)

// Environment variables read by loadConfig, the only place that reads the
// environment. The pacing and budget variables (pacing.EnvRate, …) and the
// pool caps (pool.EnvMaxConnections, …) are read there too, through their
// packages' parsers.
const (
	envCodexHome      = "CODEX_HOME" // Codex CLI's home; auth.json lives there
	envHome           = "HOME"
	envAgentToken     = "CLODEX_AGENT_TOKEN"      // the fleet's agent token, when no file is given
	envAgentTokenFile = "CLODEX_AGENT_TOKEN_FILE" // default of --agent-token-file
)

// osLookupEnv is the process environment; run hands it to loadConfig.
var osLookupEnv = os.LookupEnv

const defaultListen = "127.0.0.1:17645"

// Values of --refresh.
const (
	refreshAuto  = "auto"
	refreshNever = "never"
)

// config is the data plane's configuration, loaded once in run.
type config struct {
	// Listen is the API listen address. (Optional; default
	// 127.0.0.1:17645) A non-loopback address requires APIKeyFile.
	Listen string
	// UpstreamURL is the Codex Responses WebSocket. (Optional; default
	// wss://chatgpt.com/backend-api/codex/responses)
	UpstreamURL string
	// CodexAuth is the Codex CLI auth.json holding the ChatGPT sign-in.
	// (Optional; default $CODEX_HOME/auth.json, else ~/.codex/auth.json)
	CodexAuth string
	// TokenEndpoint is the OAuth token endpoint used to refresh CodexAuth.
	// (Optional; default https://auth.openai.com/oauth/token)
	TokenEndpoint string
	// Refresh is "auto" (refresh CodexAuth before it expires) or "never"
	// (re-read it; another host or the operator refreshes it). (Optional;
	// default auto standalone, never with ControlPlane)
	Refresh string
	// AdminListen serves /metrics and /debug/pprof. (Optional; default off)
	AdminListen string
	// APIKeyFile holds the key clients must send on a non-loopback
	// listener, first line. (Optional on loopback)
	APIKeyFile string
	// AllowedOrigins are browser origins allowed to call the API.
	// (Optional; default none)
	AllowedOrigins []string
	// ModelAliases is "pattern=model,..." added before the default aliases.
	// (Optional)
	ModelAliases string

	// ControlPlane is the fleet's control plane, host:port. (Optional;
	// default none: an embedded control plane runs in-process)
	ControlPlane string
	// AgentTokenFile holds the fleet's agent token. (Required with
	// ControlPlane unless CLODEX_AGENT_TOKEN is set; default
	// $CLODEX_AGENT_TOKEN_FILE)
	AgentTokenFile string
	// AgentTokenEnv is CLODEX_AGENT_TOKEN, used when no file is given.
	AgentTokenEnv string
	// TLSCA verifies the control plane; TLSCert and TLSKey present a
	// client certificate. (Optional, only with ControlPlane; default
	// plaintext)
	TLSCA, TLSCert, TLSKey string
	// DataDir keeps the embedded control plane's policies in
	// DataDir/policy.json. (Optional, only without ControlPlane; default
	// policies live in memory)
	DataDir string
	// WSDiagnostics receives one ws_head_decision JSON line per request;
	// "-" is stderr. (Optional; default off)
	WSDiagnostics string

	// ShutdownGrace bounds how long in-flight turns may finish on
	// SIGINT/SIGTERM before their sockets are closed. (Optional; default 30s)
	ShutdownGrace time.Duration
	// LogLevel is debug, info, warn or error. (Optional; default info)
	LogLevel string
	// Version prints the version and exits.
	Version bool

	// Policy is the default pacing policy from the seed's variables
	// (CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN,
	// CLODEX_UPSTREAM_{IDLE,TOTAL}_TIMEOUT_MS, CLODEX_UPSTREAM_MAX_RETRIES):
	// the embedded control plane's default and the local fallback's.
	// Policy.Budget bounds every turn.
	Policy pacing.Policy
	// Notices are the one-time messages about those variables and the
	// pool caps (malformed or clamped values, pacing off).
	Notices []pacing.Notice
	// MaxConnections and MaxNurseryConnections cap the pool's heads
	// (CLODEX_WS_MAX_CONNECTIONS, CLODEX_WS_MAX_NURSERY_CONNECTIONS;
	// default 0, unbounded).
	MaxConnections, MaxNurseryConnections int

	// lookupEnv is the environment the config was loaded from, handed on to
	// telemetry setup (OTEL_* variables).
	lookupEnv func(string) (string, bool)
}

// fleet reports whether the data plane joins a remote control plane.
func (c *config) fleet() bool { return c.ControlPlane != "" }

// refreshMode is the parsed Refresh; Validate has checked it.
func (c *config) refreshMode() credentials.RefreshMode {
	m, _ := credentials.ParseRefreshMode(c.Refresh)
	return m
}

// usageError is a bad command line; main exits 2 for it.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// loadConfig parses args and the environment (through lookupEnv) into a
// validated config.
func loadConfig(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*config, error) {
	getenv := func(k string) string { v, _ := lookupEnv(k); return v }
	c := &config{lookupEnv: lookupEnv}
	fs := flag.NewFlagSet("clodex-dataplane", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Listen, "listen", defaultListen, "`address` of the Anthropic API listener (non-loopback needs --api-key-file)")
	fs.StringVar(&c.UpstreamURL, "upstream-url", upstream.DefaultURL, "Codex Responses WebSocket `URL` (ws:// or wss://)")
	fs.StringVar(&c.CodexAuth, "codex-auth", "", "Codex CLI auth.json `file` with the ChatGPT sign-in (default $CODEX_HOME/auth.json or ~/.codex/auth.json)")
	fs.StringVar(&c.TokenEndpoint, "token-endpoint", credentials.DefaultTokenEndpoint, "OAuth token endpoint `URL` used to refresh --codex-auth")
	fs.StringVar(&c.Refresh, "refresh", "", "refresh --codex-auth before it expires: `auto` or never (default auto; never with --control-plane)")
	fs.StringVar(&c.AdminListen, "admin-listen", "", "`address` for /metrics and /debug/pprof (default off)")
	fs.StringVar(&c.APIKeyFile, "api-key-file", "", "`file` whose first line is the API key clients must send (required off loopback)")
	origins := fs.String("allowed-origins", "", "comma-separated browser `origins` allowed to call the API, e.g. http://localhost:3000")
	fs.StringVar(&c.ModelAliases, "model-aliases", "", "model aliases `pattern=model,...` tried before the defaults (pattern may end in *)")
	fs.StringVar(&c.ControlPlane, "control-plane", "", "join the fleet whose control plane listens at `host:port` (default: run one embedded in-process)")
	fs.StringVar(&c.AgentTokenFile, "agent-token-file", getenv(envAgentTokenFile), "`file` holding the fleet's agent token (or set "+envAgentToken+")")
	fs.StringVar(&c.TLSCA, "tls-ca", "", "verify the control plane with this CA PEM `file` (default plaintext)")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "client certificate PEM `file` for the control plane (with --tls-key)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "client key PEM `file` (with --tls-cert)")
	fs.StringVar(&c.DataDir, "data-dir", "", "`directory` where the embedded control plane keeps policy.json (default: policies in memory)")
	fs.StringVar(&c.WSDiagnostics, "ws-diagnostics", "", "append one JSON line per socket decision to `file` (- for stderr; default off)")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 30*time.Second, "how long in-flight turns may finish on shutdown")
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
	for _, o := range strings.Split(*origins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			c.AllowedOrigins = append(c.AllowedOrigins, o)
		}
	}
	if c.CodexAuth == "" {
		c.CodexAuth = defaultCodexAuth(lookupEnv)
	}
	if c.Refresh == "" {
		c.Refresh = refreshAuto
		if c.fleet() {
			c.Refresh = refreshNever
		}
	}
	if c.AgentTokenFile == "" {
		c.AgentTokenEnv = strings.TrimSpace(getenv(envAgentToken))
	}
	c.Policy, c.Notices = pacing.PolicyFromEnv(lookupEnv)
	c.MaxConnections, c.MaxNurseryConnections = pool.CapsFromEnv(getenv, func(msg string) {
		c.Notices = append(c.Notices, pacing.Notice{Key: "pool.caps:" + msg, Message: msg})
	})
	if err := c.Validate(); err != nil {
		return nil, &usageError{msg: err.Error()}
	}
	return c, nil
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

// Validate reports every problem at once, naming the flag and the allowed
// values.
func (c *config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q is not host:port (e.g. 127.0.0.1:17645)", c.Listen))
	}
	if c.AdminListen != "" {
		if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
			errs = append(errs, fmt.Errorf("--admin-listen %q is not host:port (e.g. 127.0.0.1:17646)", c.AdminListen))
		}
	}
	if u, err := url.Parse(c.UpstreamURL); err != nil || u.Host == "" ||
		(u.Scheme != "ws" && u.Scheme != "wss" && u.Scheme != "http" && u.Scheme != "https") {
		errs = append(errs, fmt.Errorf("--upstream-url %q is not a ws://, wss://, http:// or https:// URL with a host", c.UpstreamURL))
	}
	if u, err := url.Parse(c.TokenEndpoint); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		errs = append(errs, fmt.Errorf("--token-endpoint %q is not an http:// or https:// URL with a host", c.TokenEndpoint))
	}
	if _, err := credentials.ParseRefreshMode(c.Refresh); err != nil {
		errs = append(errs, fmt.Errorf("--refresh %q is invalid; choices are auto, never", c.Refresh))
	}
	if !isLoopbackListen(c.Listen) && c.APIKeyFile == "" {
		errs = append(errs, fmt.Errorf("--listen %s is not a loopback address: --api-key-file is required (or listen on 127.0.0.1)", c.Listen))
	}
	if c.fleet() {
		if _, _, err := net.SplitHostPort(c.ControlPlane); err != nil {
			errs = append(errs, fmt.Errorf("--control-plane %q is not host:port (e.g. controlplane.internal:17700)", c.ControlPlane))
		}
		if c.AgentTokenFile == "" && c.AgentTokenEnv == "" {
			errs = append(errs, fmt.Errorf("--control-plane needs the agent token: pass --agent-token-file FILE or set %s", envAgentToken))
		}
		if c.DataDir != "" {
			errs = append(errs, errors.New("--data-dir applies only to the embedded control plane; drop it or drop --control-plane"))
		}
		if (c.TLSCert == "") != (c.TLSKey == "") {
			errs = append(errs, errors.New("--tls-cert and --tls-key must be given together"))
		}
	} else {
		for _, f := range []struct{ name, v string }{
			{"--agent-token-file", c.AgentTokenFile}, {"--tls-ca", c.TLSCA}, {"--tls-cert", c.TLSCert}, {"--tls-key", c.TLSKey},
		} {
			if f.v != "" {
				errs = append(errs, fmt.Errorf("%s applies only with --control-plane ADDR (without it the control plane is embedded)", f.name))
			}
		}
	}
	if c.ShutdownGrace <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-grace %v must be positive", c.ShutdownGrace))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func isLoopbackListen(addr string) bool {
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

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("--log-level %q is invalid; choices are debug, info, warn, error", s)
}

// readAPIKey returns the first line of the key file, trimmed.
func readAPIKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read --api-key-file: %w", err)
	}
	key, _, _ := strings.Cut(string(b), "\n")
	key = strings.TrimSpace(key)
	if key == "" {
		return "", fmt.Errorf("--api-key-file %s: the first line is empty; want the API key", path)
	}
	return key, nil
}

// budgets is the turn budget per account: the latest one the control
// plane pushed for the account's key (clodexctl set-budget), else the
// environment's. It is the gateway's Config.BudgetFor.
type budgets struct {
	fallback pacing.Budget

	mu    sync.Mutex // guards byKey
	byKey map[string]pacing.Budget
}

func newBudgets(fallback pacing.Budget) *budgets {
	return &budgets{fallback: fallback, byKey: make(map[string]pacing.Budget)}
}

// set records the budget pushed for an account key.
func (b *budgets) set(key string, budget pacing.Budget) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.byKey[key] = budget
}

// forAccount returns the budget of a turn on accountID.
func (b *budgets) forAccount(accountID string) pacing.Budget {
	if accountID == "" {
		return b.fallback
	}
	key := account.Key(accountID)
	b.mu.Lock()
	defer b.mu.Unlock()
	if v, ok := b.byKey[key]; ok {
		return v
	}
	return b.fallback
}
