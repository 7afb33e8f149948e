package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/clodex/clodex/dataplane/accounts"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/pacing"
	"github.com/clodex/clodex/internal/telemetry"
)

// Defaults of Config.
const (
	DefaultListen        = "127.0.0.1:17645"
	DefaultShutdownGrace = 30 * time.Second
	DefaultVersion       = "dev"
)

// Values of Config.Refresh.
const (
	RefreshAuto  = "auto"
	RefreshNever = "never"
)

// EnvAgentToken is the environment variable clodex-dataplane reads
// Config.AgentToken from; errors about a missing token name it.
const EnvAgentToken = "CLODEX_AGENT_TOKEN"

// Config is a data plane's configuration. Its fields are the flags of
// clodex-dataplane, and errors name the flag (--listen, --data-dir, …);
// the zero value of an optional field means the flag's default. Start
// copies it and never modifies the caller's value.
type Config struct {
	// Listen is the API listen address. (Optional; default
	// 127.0.0.1:17645) A non-loopback address requires APIKeyFile.
	Listen string
	// UpstreamURL is the Codex Responses WebSocket. (Optional; default
	// wss://chatgpt.com/backend-api/codex/responses)
	UpstreamURL string
	// CodexAuth is the Codex CLI auth.json holding the ChatGPT sign-in.
	// (Required without ControlPlane; clodex-dataplane defaults it to
	// $CODEX_HOME/auth.json, else ~/.codex/auth.json. With ControlPlane
	// and no CodexAuth, the data plane takes short-lived access tokens
	// for its accounts from the control plane's credential broker.)
	CodexAuth string
	// ExtraCodexAuth are further auth.json files (--codex-auth repeated),
	// each a different ChatGPT account refreshed under its own file lock;
	// new conversations are spread over all of them by headroom.
	// (Optional; not with a brokered fleet member)
	ExtraCodexAuth []string
	// TokenEndpoint is the OAuth token endpoint used to refresh CodexAuth.
	// (Optional; default https://auth.openai.com/oauth/token)
	TokenEndpoint string
	// Refresh is "auto" (refresh CodexAuth before it expires) or "never"
	// (re-read it; another host or the operator refreshes it). (Optional;
	// default auto standalone, never with ControlPlane)
	Refresh string
	// AdminListen serves /metrics, /debug/ and, with Pprof, /debug/pprof.
	// (Optional; default off) A non-loopback address requires
	// MetricsTokenFile.
	AdminListen string
	// MetricsTokenFile holds the bearer token every admin request must
	// carry. (Required when AdminListen is not loopback; Optional there)
	MetricsTokenFile string
	// Pprof serves /debug/pprof on the admin listener. (Optional; default
	// off)
	Pprof bool
	// APIKeyFile holds the key clients must send on a non-loopback
	// listener, first line. (Optional on loopback; not with MemberKeys)
	APIKeyFile string
	// MemberKeys serves only the keys of the team's members, on any
	// listener: the member list comes from the control plane
	// (ControlPlane, required), and each turn is its member's (their
	// accounts, pin and cap). (Optional; default off)
	MemberKeys bool
	// AllowedOrigins are browser origins allowed to call the API.
	// (Optional; default none)
	AllowedOrigins []string
	// ModelAliases is "pattern=model,..." added before the default aliases.
	// (Optional)
	ModelAliases string
	// ModelPassthrough sends model names no alias matches and no known
	// upstream model has to the backend unchanged, instead of answering
	// 400. (Optional; default off)
	ModelPassthrough bool
	// FailureRetries is how many times a turn retries, inside the data
	// plane, a failure the client retries itself (5xx, an unreachable
	// backend, a 429) while the upstream is healthy; none while it is
	// failing. (Optional; default retry.DefaultFailureRetries, 1;
	// retry.NoFailureRetries for none; at most the turn budget's retries)
	FailureRetries int
	// UsageLimitHold is how long an account at its usage limit takes no
	// new conversation when the backend's usage-limit error gives no reset
	// time (--usage-limit-hold, CLODEX_USAGE_LIMIT_HOLD). (Optional;
	// default 5m; accounts.MinUsageLimitHold..accounts.MaxUsageLimitHold)
	UsageLimitHold time.Duration

	// ControlPlane is the fleet's control plane: host:port (a name may
	// resolve to several replicas), a comma-separated list of replicas, or
	// dns:///host:port (control.ParseControlPlanes). (Optional; default
	// none: an embedded control plane runs in-process)
	ControlPlane string
	// AgentTokenFile holds the fleet's agent token. (Required with
	// ControlPlane unless AgentToken is set)
	AgentTokenFile string
	// AgentToken is the fleet's agent token itself (CLODEX_AGENT_TOKEN),
	// used when no file is given.
	AgentToken string
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

	// ShutdownGrace bounds how long in-flight turns may finish on shutdown
	// before their sockets are closed. (Optional; default 30s)
	ShutdownGrace time.Duration
	// UsageFlush is how often the turns' usage goes to the control plane
	// (--usage-flush, 1s..10m). (Optional; default control.DefaultUsageFlush, 10s)
	UsageFlush time.Duration
	// LogLevel is debug, info, warn or error. (Optional; default info)
	LogLevel string
	// Version is reported to the control plane, the backend and the
	// traces. (Optional; default "dev")
	Version string

	// Policy is the default pacing policy (clodex-dataplane reads it with
	// pacing.PolicyFromEnv): the embedded control plane's default and the
	// local fallback's. Policy.Budget bounds every turn until the control
	// plane pushes an account's own. (Optional; the zero Policy means
	// pacing.DefaultPolicy())
	Policy pacing.Policy
	// Notices are printed once each at start (malformed or clamped
	// environment values, pacing off). (Optional)
	Notices []pacing.Notice
	// MaxConnections and MaxNurseryConnections cap the pool's heads
	// (CLODEX_WS_MAX_CONNECTIONS, CLODEX_WS_MAX_NURSERY_CONNECTIONS).
	// (Optional; default 0, unbounded)
	MaxConnections, MaxNurseryConnections int

	// LookupEnv reads the OTEL_EXPORTER_OTLP_* variables that turn on
	// trace export. (Optional; nil means none is set)
	LookupEnv func(string) (string, bool)
	// TracerProvider traces turns, their attempts and the control-plane
	// RPCs. (Optional; default the global provider, which exports when
	// LookupEnv sets an OTLP endpoint)
	TracerProvider trace.TracerProvider
	// RetryClock is the time source of every turn's retry schedule and
	// deadlines, and RetryRand the source of their jitter, uniform in
	// [0, 1). (Optional; default the system clock and math/rand/v2) Tests
	// inject them to run retries without waiting.
	RetryClock retry.Clock
	RetryRand  func() float64
}

// ConfigError is a configuration value the data plane cannot use;
// clodex-dataplane exits 2 on it.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// fleet reports whether the data plane joins a remote control plane.
func (c *Config) fleet() bool { return c.ControlPlane != "" }

// brokered reports whether the credentials come from the control plane's
// credential broker: a fleet member without an auth.json.
func (c *Config) brokered() bool { return c.fleet() && strings.TrimSpace(c.CodexAuth) == "" }

// withDefaults returns a copy of c with every zero optional field filled.
func (c Config) withDefaults() Config {
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&c.Listen, DefaultListen)
	def(&c.UpstreamURL, upstream.DefaultURL)
	def(&c.TokenEndpoint, codexauth.DefaultTokenEndpoint)
	if c.fleet() {
		def(&c.Refresh, RefreshNever)
	} else {
		def(&c.Refresh, RefreshAuto)
	}
	def(&c.LogLevel, "info")
	def(&c.Version, DefaultVersion)
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if c.Policy == (pacing.Policy{}) {
		c.Policy = pacing.DefaultPolicy()
	}
	return c
}

// refreshMode is the parsed Refresh; Validate has checked it.
func (c *Config) refreshMode() accounts.RefreshMode {
	m, _ := accounts.ParseRefreshMode(c.Refresh)
	return m
}

// Validate reports every problem at once, naming the flag and the allowed
// values. Zero optional fields stand for their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if strings.TrimSpace(c.CodexAuth) == "" && !c.fleet() {
		errs = append(errs, errors.New("--codex-auth is empty; want the Codex auth.json (default ~/.codex/auth.json), or --control-plane ADDR to take tokens from its credential broker"))
	}
	for i, f := range c.ExtraCodexAuth {
		if strings.TrimSpace(f) == "" {
			errs = append(errs, fmt.Errorf("--codex-auth #%d is empty; want a Codex auth.json file", i+2))
		}
	}
	if len(c.ExtraCodexAuth) > 0 && strings.TrimSpace(c.CodexAuth) == "" {
		errs = append(errs, errors.New("--codex-auth: the first file is empty while more are given; want one auth.json per --codex-auth"))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q is not host:port (e.g. 127.0.0.1:17645)", c.Listen))
	}
	if c.AdminListen != "" {
		if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
			errs = append(errs, fmt.Errorf("--admin-listen %q is not host:port (e.g. 127.0.0.1:17646)", c.AdminListen))
		}
	}
	if err := telemetry.CheckAdminFlags(c.AdminListen, c.MetricsTokenFile, c.Pprof); err != nil {
		errs = append(errs, err)
	}
	if u, err := url.Parse(c.UpstreamURL); err != nil || u.Host == "" ||
		(u.Scheme != "ws" && u.Scheme != "wss" && u.Scheme != "http" && u.Scheme != "https") {
		errs = append(errs, fmt.Errorf("--upstream-url %q is not a ws://, wss://, http:// or https:// URL with a host", c.UpstreamURL))
	}
	if u, err := url.Parse(c.TokenEndpoint); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		errs = append(errs, fmt.Errorf("--token-endpoint %q is not an http:// or https:// URL with a host", c.TokenEndpoint))
	}
	if _, err := accounts.ParseRefreshMode(c.Refresh); err != nil {
		errs = append(errs, fmt.Errorf("--refresh %q is invalid; choices are auto, never", c.Refresh))
	}
	if !isLoopbackListen(c.Listen) && c.APIKeyFile == "" && !c.MemberKeys {
		errs = append(errs, fmt.Errorf("--listen %s is not a loopback address: --api-key-file or --member-keys is required (or listen on 127.0.0.1)", c.Listen))
	}
	if c.MemberKeys && !c.fleet() {
		errs = append(errs, errors.New("--member-keys needs --control-plane ADDR: the members and their keys live on the fleet's control plane (clodexctl member create)"))
	}
	if c.MemberKeys && c.APIKeyFile != "" {
		errs = append(errs, errors.New("--member-keys and --api-key-file exclude each other: with --member-keys every client sends its own member key"))
	}
	if _, err := translate.ParseModelAliases(c.ModelAliases); err != nil {
		errs = append(errs, fmt.Errorf("--model-aliases: %w", err))
	}
	if c.UsageFlush != 0 && (c.UsageFlush < time.Second || c.UsageFlush > 10*time.Minute) {
		errs = append(errs, fmt.Errorf("--usage-flush %v is out of range; allowed 1s..10m", c.UsageFlush))
	}
	if c.FailureRetries < retry.NoFailureRetries || c.FailureRetries > pacing.MaxMaxRetries {
		errs = append(errs, fmt.Errorf("--failure-retries %d is out of range; allowed: 0..%d (FailureRetries: %d for none)",
			c.FailureRetries, pacing.MaxMaxRetries, retry.NoFailureRetries))
	}
	if h := c.UsageLimitHold; h != 0 && (h < accounts.MinUsageLimitHold || h > accounts.MaxUsageLimitHold) {
		errs = append(errs, fmt.Errorf("--usage-limit-hold %v is out of range; allowed %s (default 5m)", h, accounts.UsageLimitHoldRange))
	}
	if c.fleet() {
		if _, err := control.ParseControlPlanes(c.ControlPlane); err != nil {
			errs = append(errs, fmt.Errorf("--control-plane: %w", err))
		}
		if c.AgentTokenFile == "" && c.AgentToken == "" {
			errs = append(errs, fmt.Errorf("--control-plane needs the agent token: pass --agent-token-file FILE or set %s", EnvAgentToken))
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
	if c.ShutdownGrace < 0 {
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

// codexAuthFiles are the auth.json files served: CodexAuth, then
// ExtraCodexAuth (--codex-auth repeated).
func (c *Config) codexAuthFiles() []string {
	return append([]string{c.CodexAuth}, c.ExtraCodexAuth...)
}

// tracerProvider is TracerProvider, else the global one.
func (c *Config) tracerProvider() trace.TracerProvider {
	if c.TracerProvider != nil {
		return c.TracerProvider
	}
	return otel.GetTracerProvider()
}

// fileConfigs are the auth.json sources of CodexAuth and ExtraCodexAuth.
func (c *Config) fileConfigs(logger *slog.Logger, notify func(string)) []accounts.FileConfig {
	var fcs []accounts.FileConfig
	for _, path := range c.codexAuthFiles() {
		fcs = append(fcs, accounts.FileConfig{Path: path, TokenEndpoint: c.TokenEndpoint, Mode: c.refreshMode(), Logger: logger, Notify: notify})
	}
	return fcs
}

// filesError makes an error of accounts.OpenFiles a *ConfigError when the
// files cannot be served together (the same account twice, or one without
// an account id among several).
func filesError(err error) error {
	var fe *accounts.FilesError
	if errors.As(err, &fe) {
		return &ConfigError{Err: err}
	}
	return err
}

// gatewayConfig is the gateway's configuration from the flags: the
// listener, its key and origins, the model aliases and the retry clock.
// Start adds the parts it built.
func (c *Config) gatewayConfig() (gateway.Config, error) {
	models, err := translate.ParseModelAliases(c.ModelAliases)
	if err != nil {
		return gateway.Config{}, &ConfigError{Err: fmt.Errorf("--model-aliases: %w", err)}
	}
	if c.ModelPassthrough {
		models = models.WithPassthrough()
	}
	var apiKey string
	if c.APIKeyFile != "" {
		if apiKey, err = readAPIKey(c.APIKeyFile); err != nil {
			return gateway.Config{}, err
		}
	}
	return gateway.Config{RetryClock: c.RetryClock, RetryRand: c.RetryRand, Upstream: upstream.Key(c.UpstreamURL),
		ListenAddr: c.Listen, APIKey: apiKey, AllowedOrigins: c.AllowedOrigins, Models: models}, nil
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
