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
	"time"

	"github.com/clodex/clodex/dataplane/upstream"
)

// Environment variables read by loadConfig, the only place that reads the
// environment.
const (
	envCodexHome = "CODEX_HOME" // Codex CLI's home; auth.json lives there
	envHome      = "HOME"
)

const defaultListen = "127.0.0.1:17645"

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
	// TokenEndpoint is the OAuth token endpoint for refresh. (Optional;
	// accepted and stored; refresh arrives in a later part)
	TokenEndpoint string
	// ShutdownGrace bounds how long in-flight turns may finish on
	// SIGINT/SIGTERM before their sockets are closed. (Optional; default 30s)
	ShutdownGrace time.Duration
	// LogLevel is debug, info, warn or error. (Optional; default info)
	LogLevel string
	// Version prints the version and exits.
	Version bool

	// lookupEnv is the environment the config was loaded from, handed on to
	// telemetry setup (OTEL_* variables).
	lookupEnv func(string) (string, bool)
}

// osLookupEnv is the process environment; run passes it to loadConfig.
var osLookupEnv = os.LookupEnv

// usageError is a bad command line; main exits 2 for it.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// loadConfig parses args and the environment (through lookupEnv) into a
// validated config.
func loadConfig(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*config, error) {
	c := &config{lookupEnv: lookupEnv}
	fs := flag.NewFlagSet("clodex-dataplane", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Listen, "listen", defaultListen, "`address` of the Anthropic API listener (non-loopback needs --api-key-file)")
	fs.StringVar(&c.UpstreamURL, "upstream-url", upstream.DefaultURL, "Codex Responses WebSocket `URL` (ws:// or wss://)")
	fs.StringVar(&c.CodexAuth, "codex-auth", "", "Codex CLI auth.json `file` with the ChatGPT sign-in (default $CODEX_HOME/auth.json or ~/.codex/auth.json)")
	fs.StringVar(&c.AdminListen, "admin-listen", "", "`address` for /metrics and /debug/pprof (default off)")
	fs.StringVar(&c.APIKeyFile, "api-key-file", "", "`file` whose first line is the API key clients must send (required off loopback)")
	origins := fs.String("allowed-origins", "", "comma-separated browser `origins` allowed to call the API, e.g. http://localhost:3000")
	fs.StringVar(&c.ModelAliases, "model-aliases", "", "model aliases `pattern=model,...` tried before the defaults (pattern may end in *)")
	fs.StringVar(&c.TokenEndpoint, "token-endpoint", "", "OAuth token endpoint `URL` (stored for credential refresh; not used yet)")
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
	for _, o := range strings.Split(*origins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			c.AllowedOrigins = append(c.AllowedOrigins, o)
		}
	}
	if c.CodexAuth == "" {
		c.CodexAuth = defaultCodexAuth(lookupEnv)
	}
	if c.Version {
		return c, nil
	}
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
	if c.TokenEndpoint != "" {
		if u, err := url.Parse(c.TokenEndpoint); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			errs = append(errs, fmt.Errorf("--token-endpoint %q is not an http:// or https:// URL", c.TokenEndpoint))
		}
	}
	if !isLoopbackListen(c.Listen) && c.APIKeyFile == "" {
		errs = append(errs, fmt.Errorf("--listen %s is not a loopback address: --api-key-file is required (or listen on 127.0.0.1)", c.Listen))
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
