package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/codexsim/simauth"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

// usageError is a bad command line; main exits 2 for it.
type usageError struct{ msg string }

// Error returns the message on one line.
func (e *usageError) Error() string { return strings.ReplaceAll(e.msg, "\n", "; ") }

// tokenFlag collects repeated --accept-token TOKEN=ACCOUNT_ID values.
type tokenFlag map[string]string

func (t tokenFlag) String() string { return fmt.Sprintf("%d tokens", len(t)) }

func (t tokenFlag) Set(v string) error {
	tok, acct, ok := strings.Cut(v, "=")
	if !ok || tok == "" || acct == "" {
		return errors.New("want TOKEN=ACCOUNT_ID with both parts non-empty")
	}
	t[tok] = acct
	return nil
}

const shutdownTimeout = 10 * time.Second

// flagNames rewrites the Config field names in validation errors into the
// flags that set them.
var flagNames = strings.NewReplacer(
	"Faults.FirstByteDelay", "--first-byte-delay",
	"Faults.InterEventDelay", "--inter-event-delay",
	"Faults.CloseAfterEvents", "--close-after-events",
	"Faults.Upgrade5xxShare", "--upgrade-5xx-share",
	"Faults.Upgrade5xxStatus", "--upgrade-5xx-status",
	"Faults.RetryAfter403", "--retry-after-403",
	"Faults.FailResponses", "--fail-responses",
	"Faults.UsageLimitResetsIn", "--usage-limit-resets-in",
	"Faults.UsageLimitPlan", "--usage-limit-plan",
	"Quota.PrimaryWindow", "--quota-primary-window",
	"Quota.SecondaryWindow", "--quota-secondary-window",
	"Quota.PrimaryStart", "--quota-primary-start",
	"Quota.SecondaryStart", "--quota-secondary-start",
	"Quota.PrimaryPerResponse", "--quota-primary-per-response",
	"Quota.SecondaryPerResponse", "--quota-secondary-per-response",
	"Quota.Plan", "--quota-plan",
	"UpgradeLimit", "--upgrade-limit",
	"UpgradeWindow", "--upgrade-window",
	"InstantLimit", "--instant-limit",
	"MaxOpenSockets", "--max-open-sockets",
	"MaxFrameBytes", "--max-frame-bytes",
	"SocketLifetime", "--socket-lifetime",
	"DeltaInterval", "--delta-interval",
	"WriteTimeout", "--write-timeout",
	"RefreshTTL", "--refresh-ttl",
	"TokenTTL", "--token-ttl",
	"DeviceAccountID", "--auth-account",
)

// run parses args, serves until ctx ends, then shuts down: stop accepting,
// close every socket with 1001, wait for them.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("clodex-sim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		listen        = fs.String("listen", "127.0.0.1:17800", "address to listen on (host:port; port 0 picks one)")
		cfg           codexsim.Config
		accept        = tokenFlag{}
		writeAuth     = fs.String("write-auth", "", "write a Codex-format auth.json (auth_mode chatgpt) with tokens the emulator issued to this path at start-up")
		authAccount   = fs.String("auth-account", simauth.DefaultDeviceAccountID, "ChatGPT account id of the --write-auth tokens and of device-code logins")
		tokenTTL      = fs.Duration("token-ttl", simauth.DefaultTokenTTL, "lifetime of issued access tokens (at least 1s)")
		refreshTTL    = fs.Duration("refresh-ttl", simauth.DefaultRefreshTTL, "lifetime of issued refresh tokens (at least 1s)")
		maxFrameBytes = fs.Int64("max-frame-bytes", codexsim.DefaultMaxFrameBytes, "largest client frame accepted; larger ones get a request_too_large error frame")
		logLevel      = fs.String("log-level", "info", "log level: debug, info, warn or error")
		showVersion   = fs.Bool("version", false, "print the version and exit")
	)
	fs.IntVar(&cfg.UpgradeLimit, "upgrade-limit", codexsim.DefaultUpgradeLimit, "accepted upgrades per account in the trailing window; the next answers 403")
	fs.DurationVar(&cfg.UpgradeWindow, "upgrade-window", codexsim.DefaultUpgradeWindow, "length of the throttle window")
	fs.BoolVar(&cfg.CountRejected, "count-rejected", false, "let throttle rejections count toward the window")
	fs.IntVar(&cfg.InstantLimit, "instant-limit", 0, "max upgrades per account in any second (0 = off)")
	fs.IntVar(&cfg.MaxOpenSockets, "max-open-sockets", 0, "max concurrently open sockets per account (0 = off)")
	fs.Var(accept, "accept-token", "TOKEN=ACCOUNT_ID: accept this bearer token for the account without signature checks (repeatable)")
	fs.DurationVar(&cfg.SocketLifetime, "socket-lifetime", codexsim.DefaultSocketLifetime, "socket age after which response.create answers websocket_connection_limit_reached")
	fs.DurationVar(&cfg.DeltaInterval, "delta-interval", 0, "pause between delta events")
	fs.DurationVar(&cfg.WriteTimeout, "write-timeout", codexsim.DefaultWriteTimeout, "close a socket whose client has not taken a frame for this long")
	fs.DurationVar(&cfg.Faults.FirstByteDelay, "first-byte-delay", 0, "fault: pause before the first event of every response")
	fs.DurationVar(&cfg.Faults.InterEventDelay, "inter-event-delay", 0, "fault: pause between any two events")
	fs.IntVar(&cfg.Faults.CloseAfterEvents, "close-after-events", 0, "fault: drop a socket (no close frame) after it sent this many events (0 = off)")
	fs.Float64Var(&cfg.Faults.Upgrade5xxShare, "upgrade-5xx-share", 0, "fault: share of upgrades, in [0,1], answered with --upgrade-5xx-status")
	fs.IntVar(&cfg.Faults.Upgrade5xxStatus, "upgrade-5xx-status", 503, "fault: status of injected upgrade failures (500-599)")
	fs.BoolVar(&cfg.Faults.Stall, "stall", false, "fault: every response sends response.created and then nothing")
	fs.DurationVar(&cfg.Faults.RetryAfter403, "retry-after-403", 0, "send a retry-after header (whole seconds) with throttle 403s (0 = none, like the real edge)")
	fs.StringVar(&cfg.Faults.FailResponses, "fail-responses", "", "fault: every generating response fails with this error code (server_error, server_is_overloaded, rate_limit_exceeded, ...)")
	fs.DurationVar(&cfg.Faults.UsageLimitResetsIn, "usage-limit-resets-in", 0, "fault: the plan's usage limit is reached and resets this long after start-up (0 = off)")
	fs.StringVar(&cfg.Faults.UsageLimitPlan, "usage-limit-plan", codexsim.DefaultUsageLimitPlan, "plan_type of usage-limit errors")
	fs.DurationVar(&cfg.Quota.PrimaryWindow, "quota-primary-window", codexsim.DefaultPrimaryWindow, "codex.rate_limits: the primary usage window's length")
	fs.DurationVar(&cfg.Quota.SecondaryWindow, "quota-secondary-window", codexsim.DefaultSecondaryWindow, "codex.rate_limits: the secondary (weekly) usage window's length")
	fs.Float64Var(&cfg.Quota.PrimaryStart, "quota-primary-start", codexsim.DefaultPrimaryStart, "codex.rate_limits: each account's used percent of the primary window at its first response (-1 for 0)")
	fs.Float64Var(&cfg.Quota.SecondaryStart, "quota-secondary-start", codexsim.DefaultSecondaryStart, "codex.rate_limits: each account's used percent of the secondary window at its first response (-1 for 0)")
	fs.Float64Var(&cfg.Quota.PrimaryPerResponse, "quota-primary-per-response", 0, "percent of the primary window each generating response uses; at 100 the account gets usage_limit_reached until the window resets")
	fs.Float64Var(&cfg.Quota.SecondaryPerResponse, "quota-secondary-per-response", 0, "percent of the secondary window each generating response uses")
	fs.StringVar(&cfg.Quota.Plan, "quota-plan", codexsim.DefaultQuotaPlan, "codex.rate_limits: the plan_type reported")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprintln(stdout, "usage: clodex-sim --listen ADDR [--upgrade-limit N] [--upgrade-window DURATION] [--count-rejected] [--accept-token TOKEN=ACCOUNT_ID ...] [--write-auth PATH] [--token-ttl DURATION] [flags]")
			fs.PrintDefaults()
			return nil
		}
		return &usageError{msg: err.Error() + " (see clodex-sim --help)"}
	}
	if fs.NArg() > 0 {
		return &usageError{msg: fmt.Sprintf("unexpected argument %q; clodex-sim takes flags only (see --help)", fs.Arg(0))}
	}
	if *showVersion {
		fmt.Fprintln(stdout, "clodex-sim", version)
		return nil
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return &usageError{msg: fmt.Sprintf("--log-level %q is invalid; want debug, info, warn or error", *logLevel)}
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	auth, err := simauth.New(simauth.Config{TokenTTL: *tokenTTL, RefreshTTL: *refreshTTL, DeviceAccountID: *authAccount, Logger: logger})
	if err != nil {
		return &usageError{msg: flagNames.Replace(err.Error())}
	}
	cfg.AcceptTokens = accept
	cfg.MaxFrameBytes = *maxFrameBytes
	cfg.Auth = auth
	cfg.Logger = logger
	sim, err := codexsim.New(cfg)
	if err != nil {
		return &usageError{msg: flagNames.Replace(err.Error())}
	}
	defer sim.Close()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	addr := ln.Addr().String()
	if *writeAuth != "" {
		if err := auth.WriteAuthFile(*writeAuth, *authAccount); err != nil {
			ln.Close()
			return fmt.Errorf("write auth file: %w", err)
		}
		logger.Info("wrote auth.json", "path", *writeAuth, "account", *authAccount)
	}
	hs := &http.Server{Handler: sim.Handler(), ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()

	logger.Info("clodex-sim serving", "addr", addr,
		"chatgpt_ws", "ws://"+addr+codexsim.ChatGPTPath, "apikey_ws", "ws://"+addr+codexsim.APIKeyPath,
		"token_endpoint", "http://"+addr+"/oauth/token", "stats", "http://"+addr+codexsim.StatsPath)
	fmt.Fprintf(stdout, "ws://%s%s\n", addr, codexsim.ChatGPTPath)

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	shutdownErr := hs.Shutdown(sctx)
	if err := sim.Close(); err != nil && shutdownErr == nil {
		shutdownErr = err
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) { // ErrServerClosed is what Serve returns once Shutdown began
		return fmt.Errorf("serve: %w", errors.Join(err, shutdownErr))
	}
	if shutdownErr != nil {
		return fmt.Errorf("shutdown: %w", shutdownErr)
	}
	return nil
}
