package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"golang.org/x/sync/errgroup"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/admission"
	"github.com/clodex/clodex/dataplane/agent"
	"github.com/clodex/clodex/dataplane/brokered"
	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/pacing"
	"github.com/clodex/clodex/internal/telemetry"
)

// ErrClosed is returned by Serve on a Node that was closed before it
// served, or that is serving already.
var ErrClosed = errors.New("data plane closed or already serving")

// Node is one running data plane: every component it owns, in the order
// Start builds them. Close tears them down in reverse.
type Node struct {
	cfg    Config // defaults filled
	logger *slog.Logger
	notify func(string)

	stopTelemetry func(context.Context) error
	diagnostics   io.Closer // --ws-diagnostics file, or nil
	cp            *controlPlaneConn
	adm           *admission.Client
	ag            *agent.Agent
	credCancel    context.CancelFunc // stops runCredentials (brokered credentials only)
	credDone      chan struct{}      // closed when runCredentials has returned
	agentCancel   context.CancelFunc
	agentDone     chan struct{} // closed when ag.Run has returned
	recoverKick   chan struct{} // size 1: the agent stream has connected
	recoverDone   chan struct{} // closed when recoverLoop has returned
	pool          *pool.Pool
	gw            *gateway.Server
	servers       []*http.Server // servers[0] is the API
	listeners     []net.Listener

	closeOnce sync.Once
	closing   chan struct{} // closed when Close starts

	mu      sync.Mutex // guards the following fields
	serving bool       // Serve has started the servers
	closed  bool       // Close has started
}

// Start builds the data plane in front of the upstream cfg names and
// starts listening: the logger and the one-time notices on stderr,
// telemetry, the control plane (remote, or embedded and reached through
// the same gRPC client path), the agent, the admission client, the
// connection pool (new sockets asked for admission, upstream 403s reported
// to the control plane), the gateway, and the API and admin listeners.
// When ready it prints the export line for the shell on stdout. ctx bounds
// the start only; the Node runs until Close. On failure Start closes
// whatever it built, through the same Close as a shutdown. A bad value in
// cfg is a *ConfigError.
func Start(ctx context.Context, cfg Config, stdout, stderr io.Writer) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, &ConfigError{Err: err}
	}
	cfg = cfg.withDefaults()
	stderr = &lockedWriter{w: stderr} // shared by the logger, notices and diagnostics
	level, _ := parseLevel(cfg.LogLevel)
	n := &Node{
		cfg:    cfg,
		logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
		notify: func(msg string) {
			fmt.Fprintln(stderr, "clodex-dataplane:", strings.TrimPrefix(msg, "clodex: "))
		},
		closing: make(chan struct{}),
	}
	defer func() {
		if err != nil {
			n.Close(context.WithoutCancel(ctx))
		}
	}()
	logger := n.logger

	// The environment's notices, once each.
	var notices pacing.Notices
	for _, notice := range cfg.Notices {
		notices.Emit(notice, n.notify)
	}

	// The credential: the auth.json, or (a fleet without one) the control
	// plane's credential broker, built once the control plane is dialed.
	var creds gateway.CredentialsSource
	var credsFor accountCredential              // the credential of a named account, when creds serves several
	var fileCreds []*credentials.RefreshingFile // one per --codex-auth, each its own account
	if !cfg.brokered() {
		for _, path := range cfg.codexAuthFiles() {
			f, err := credentials.NewFileSource(credentials.FileConfig{
				Path:          path,
				TokenEndpoint: cfg.TokenEndpoint,
				Mode:          cfg.refreshMode(),
				Logger:        logger,
				Notify:        n.notify,
			})
			if err != nil {
				return nil, err
			}
			fileCreds = append(fileCreds, f)
		}
		creds = fileCreds[0]
	}
	// The accounts served and what is known of their limits: each new
	// conversation goes to the one with the most headroom.
	served := accounts.New(time.Now)
	models, err := translate.ParseModelAliases(cfg.ModelAliases)
	if err != nil {
		return nil, &ConfigError{Err: fmt.Errorf("--model-aliases: %w", err)}
	}
	if cfg.ModelPassthrough {
		models = models.WithPassthrough()
	}
	health, err := retry.NewHealth(retry.HealthConfig{FailureRetries: cfg.FailureRetries, Clock: cfg.RetryClock,
		Logger: logger.With("component", "dataplane/retry")})
	if err != nil {
		return nil, &ConfigError{Err: fmt.Errorf("--failure-retries: %w", err)}
	}
	upstreamKey := upstream.Key(cfg.UpstreamURL)
	var apiKey string
	if cfg.APIKeyFile != "" {
		if apiKey, err = readAPIKey(cfg.APIKeyFile); err != nil {
			return nil, err
		}
	}
	var diag io.Writer
	switch cfg.WSDiagnostics {
	case "":
	case "-":
		diag = stderr
	default:
		f, err := os.OpenFile(cfg.WSDiagnostics, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open --ws-diagnostics: %w", err)
		}
		diag, n.diagnostics = f, f
	}

	host, _ := os.Hostname()
	agentID := agent.NewID(host, os.Getpid())
	n.stopTelemetry, err = telemetry.Setup(ctx, telemetry.Config{
		ServiceName: "clodex-dataplane",
		Version:     cfg.Version,
		InstanceID:  agentID,
		LookupEnv:   cfg.LookupEnv,
	})
	if err != nil {
		return nil, fmt.Errorf("set up telemetry: %w", err)
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	reg := telemetry.NewRegistry()

	// The control plane: remote, or embedded and reached the same way.
	if cfg.fleet() {
		n.cp, err = dialRemote(&cfg, n.notify, tp)
		logger.Info("control plane", "addr", cfg.ControlPlane, "tls", cfg.TLSCA != "" || cfg.TLSCert != "")
	} else {
		n.cp, err = startEmbedded(ctx, &cfg, logger, reg, tp)
		logger.Info("control plane embedded", "data_dir", cfg.DataDir, "default_rate_per_minute", cfg.Policy.RatePerMinute)
	}
	if err != nil {
		return nil, err
	}

	// The accounts this data plane serves, for the agent's hello and the
	// local fallback's share. Today one credential means one account.
	accts := &accountSet{}
	// The turn budget per account, updated by the control plane's pushes.
	turnBudgets := newBudgets(cfg.Policy.Budget)
	if fileCreds != nil {
		if len(fileCreds) > 1 {
			multi, err := newFileAccounts(ctx, cfg.codexAuthFiles(), fileCreds)
			if err != nil {
				return nil, &ConfigError{Err: err}
			}
			creds, credsFor = multi, multi.CredentialFor
			for _, id := range multi.order {
				served.Add(id)
				accts.add(account.Key(id))
			}
			logger.Info("serving several accounts", "accounts", len(multi.order))
		} else if cred, err := fileCreds[0].Credential(ctx); err == nil && cred.AccountID != "" {
			accts.add(account.Key(cred.AccountID))
		}
	} else {
		src, err := brokered.New(brokered.Config{
			Conn:   n.cp.conn,
			Target: cfg.ControlPlane,
			Logger: logger,
			OnAccounts: func(keys []string) {
				for _, k := range keys {
					accts.add(k)
				}
			},
			OnAccountID: served.Add,
		})
		if err != nil {
			return nil, err
		}
		creds, credsFor = src, src.CredentialFor
		credCtx, credCancel := context.WithCancel(context.WithoutCancel(ctx))
		n.credCancel, n.credDone = credCancel, make(chan struct{})
		go n.runCredentials(credCtx, src)
		logger.Info("credentials from the control plane's credential broker", "addr", cfg.ControlPlane)
	}
	n.ag, err = agent.New(agent.Config{
		Conn:     n.cp.conn,
		ID:       agentID,
		Host:     host,
		Version:  cfg.Version,
		Accounts: accts.keys,
		OnPolicy: func(key string, p pacing.Policy, live int) {
			// The local fallback's policy; n.adm is set before the agent runs.
			if err := n.adm.SetPolicy(key, p); err != nil {
				logger.Warn("policy from the control plane", "account", key, "err", err)
				return
			}
			turnBudgets.set(key, p.Budget)
			logger.Info("policy from the control plane", "account", key, "rate_per_minute", p.RatePerMinute,
				"burst", p.Burst, "live_agents", live, "max_retries", p.Budget.MaxRetries,
				"idle_timeout", p.Budget.IdleTimeout, "total_timeout", p.Budget.TotalTimeout)
		},
		// A 403 anywhere in the fleet paused the account: requests that
		// were granted a slot and still wait give it back.
		OnPause: func(key string, until time.Time) { n.adm.SetPause(key, until) },
		// The control plane is back: admission asks it again at once
		// instead of waiting out its own backoff, and recoverLoop hands
		// the outage's local grants over. n.adm is set before the agent
		// runs.
		OnConnect: func() {
			n.adm.CentralMaybeBack()
			select {
			case n.recoverKick <- struct{}{}:
			default:
			}
		},
		Logger: logger,
	})
	if err != nil {
		return nil, err
	}
	n.adm, err = admission.New(admission.Config{
		Conn:       n.cp.conn,
		AgentID:    agentID,
		Fallback:   cfg.Policy,
		LiveAgents: n.ag.LiveAgents,
		Notify:     n.notify,
		Logger:     logger,
	})
	if err != nil {
		return nil, err
	}
	agentCtx, agentCancel := context.WithCancel(context.WithoutCancel(ctx))
	n.agentCancel, n.agentDone = agentCancel, make(chan struct{})
	n.recoverKick, n.recoverDone = make(chan struct{}, 1), make(chan struct{})
	go n.recoverLoop(agentCtx)
	go n.runAgent(agentCtx)

	// Every response's codex.rate_limits goes to the control plane (the
	// fleet's quota view).
	limits := &rateLimitsSink{now: time.Now, report: n.ag.ReportRateLimits, served: served}
	n.pool, err = pool.New(pool.Config{
		Upstream: upstream.DialOptions{
			URL:     cfg.UpstreamURL,
			Version: cfg.Version,
			Logger:  logger.With("component", "dataplane/upstream"),
		},
		Credentials: poolCredentials(creds, credsFor),
		// An upstream known to be unreachable refuses a new socket at once,
		// before admission, so that it does not spend the account's bucket.
		Health:  health,
		OnFrame: limits.accountFrame,
		// Every upgrade the backend refuses with 403 is reported to the
		// control plane (adaptive pacing lowers the account's rate on them).
		OnForbidden: func(accountID, retryAfter string) {
			n.ag.Report403(account.Key(accountID), parseRetryAfter(retryAfter))
		},
		Admitter: pool.AdmitterFunc(func(ctx context.Context, accountID string) error {
			key := account.Key(accountID)
			accts.add(key)
			return n.adm.Admit(ctx, key)
		}),
		Logger:                logger,
		Notify:                n.notify,
		MaxConnections:        cfg.MaxConnections,
		MaxNurseryConnections: cfg.MaxNurseryConnections,
		Diagnostics:           diag,
		Registerer:            reg,
	})
	if err != nil {
		return nil, err
	}
	n.gw, err = gateway.New(gateway.Config{
		Credentials:    creds,
		Accounts:       served,
		Pool:           n.pool,
		Budget:         cfg.Policy.Budget,
		BudgetFor:      turnBudgets.forAccount,
		RetryClock:     cfg.RetryClock,
		RetryRand:      cfg.RetryRand,
		Health:         health,
		Upstream:       upstreamKey,
		ListenAddr:     cfg.Listen,
		APIKey:         apiKey,
		AllowedOrigins: cfg.AllowedOrigins,
		Models:         models,
		Logger:         logger.With("component", "dataplane/gateway"),
		Registry:       reg,
		TracerProvider: tp,
	})
	if err != nil {
		return nil, err
	}

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on --listen %s: %w", cfg.Listen, err)
	}
	ln = n.gw.Listener(ln)
	n.listeners = append(n.listeners, ln)
	n.servers = append(n.servers, &http.Server{
		Handler:           n.gw.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		MaxHeaderBytes:    gateway.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	})
	if cfg.AdminListen != "" {
		var adminToken string
		if cfg.MetricsTokenFile != "" {
			tok, warning, err := bearer.ReadFile(cfg.MetricsTokenFile)
			if err != nil {
				return nil, &ConfigError{Err: fmt.Errorf("read --metrics-token-file: %w", err)}
			}
			if warning != "" {
				logger.Warn("--metrics-token-file: " + warning)
			}
			adminToken = tok.Reveal()
		}
		aln, err := lc.Listen(ctx, "tcp", cfg.AdminListen)
		if err != nil {
			return nil, fmt.Errorf("listen on --admin-listen %s: %w", cfg.AdminListen, err)
		}
		n.listeners = append(n.listeners, aln) // closed by Close, even if the handler is refused
		controlPlane := cfg.ControlPlane
		if controlPlane == "" {
			controlPlane = "embedded"
		}
		admin, err := telemetry.AdminHandler(reg, telemetry.AdminOptions{
			Listen: cfg.AdminListen,
			Token:  adminToken,
			Pprof:  cfg.Pprof,
			Facts: map[string]string{
				"version":       cfg.Version,
				"agent_id":      agentID,
				"listen":        ln.Addr().String(),
				"upstream_url":  cfg.UpstreamURL,
				"codex_auth":    orBroker(cfg.CodexAuth),
				"refresh":       cfg.Refresh,
				"control_plane": controlPlane,
			},
		})
		if err != nil {
			return nil, &ConfigError{Err: err}
		}
		n.servers = append(n.servers, &http.Server{
			Handler:           admin,
			ReadHeaderTimeout: 10 * time.Second,
		})
		logger.Info("admin listener", "addr", aln.Addr().String())
	}

	addr := ln.Addr().String()
	if gateway.IsLoopbackAddr(cfg.Listen) {
		fmt.Fprintf(stdout, "export ANTHROPIC_BASE_URL=http://%s  # clodex-dataplane ready; any ANTHROPIC_API_KEY works on loopback\n", addr)
	} else {
		fmt.Fprintf(stdout, "export ANTHROPIC_BASE_URL=http://%s  # clodex-dataplane ready; set ANTHROPIC_API_KEY to the key in --api-key-file\n", addr)
	}
	logger.Info("serving", "addr", addr, "upstream", cfg.UpstreamURL, "agent_id", agentID,
		"account", accts.current(), "refresh", cfg.Refresh)
	return n, nil
}

// Addr is the address the API listens on ("127.0.0.1:17645").
func (n *Node) Addr() string { return n.listeners[0].Addr().String() }

// AdminAddr is the address of the admin listener (/metrics, /debug/pprof),
// or "" when Config.AdminListen is empty.
func (n *Node) AdminAddr() string {
	if len(n.listeners) < 2 {
		return ""
	}
	return n.listeners[1].Addr().String()
}

// runCredentials keeps the broker's tokens fresh until ctx ends.
func (n *Node) runCredentials(ctx context.Context, src *brokered.Source) {
	defer close(n.credDone)
	if err := src.Run(ctx); err != nil {
		n.logger.Warn("credential source ended", "err", err)
	}
}

// runAgent holds the agent's stream until ctx ends (it then says goodbye:
// the data plane deregisters).
func (n *Node) runAgent(ctx context.Context) {
	defer close(n.agentDone)
	if err := n.ag.Run(ctx); err != nil {
		n.logger.Warn("agent stream ended", "err", err)
	}
}

// recoverLoop hands admission back to the control plane each time the
// agent stream connects (admission.Client.Recover: the grants made
// locally during an outage are reported first), until ctx ends.
func (n *Node) recoverLoop(ctx context.Context) {
	defer close(n.recoverDone)
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.recoverKick:
		}
		rctx, cancel := context.WithTimeout(ctx, recoverTimeout)
		if err := n.adm.Recover(rctx); err != nil {
			n.logger.Warn("control plane reconnected, but the hand-over failed; the next new connection probes again", "err", err)
		}
		cancel()
	}
}

// recoverTimeout bounds one Recover: a few ReportGrants RPCs, each under
// the admission client's own deadline.
const recoverTimeout = 5 * time.Second

// Serve serves the listeners until ctx ends, Close is called or a listener
// fails, then shuts the data plane down (Close) and returns. It returns nil
// after a shutdown, the first listener's error, or ErrClosed when the Node
// was closed before it served (or is serving already).
func (n *Node) Serve(ctx context.Context) error {
	n.mu.Lock()
	if n.closed || n.serving {
		n.mu.Unlock()
		return ErrClosed
	}
	n.serving = true
	n.mu.Unlock()
	g, gctx := errgroup.WithContext(ctx)
	for i := range n.servers {
		srv, l := n.servers[i], n.listeners[i]
		g.Go(func() error {
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", l.Addr(), err)
			}
			return nil
		})
	}
	g.Go(func() error {
		select {
		case <-gctx.Done():
		case <-n.closing:
		}
		n.Close(context.WithoutCancel(ctx))
		return nil
	})
	return g.Wait()
}

// Close is the data plane's shutdown order, written once; every step is
// bounded and skipped when Start never built its component:
//
//  1. stop accepting and let in-flight turns finish (http.Server.Shutdown
//     within Config.ShutdownGrace);
//  2. cancel the turns still running (their sockets are closed at once)
//     and close the admin listener;
//  3. close the pool's idle sockets (1001 "pool closed");
//  4. close the admission client;
//  5. stop the agent (it says goodbye, so the control plane drops it now
//     rather than when its heartbeats lapse) and the hand-over loop;
//  6. close the gRPC connection, then stop the embedded control plane
//     (GracefulStop within 5 s, then Stop);
//  7. close the diagnostics file and flush telemetry.
//
// Close may be called more than once and from any goroutine; later calls
// wait for the first to finish. ctx carries values only: each step has its
// own bound.
func (n *Node) Close(ctx context.Context) {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.closed = true
		serving := n.serving
		n.mu.Unlock()
		close(n.closing)
		n.shutdown(ctx, serving)
	})
}

func (n *Node) shutdown(ctx context.Context, serving bool) {
	if serving {
		n.logger.Info("shutting down", "grace", n.cfg.ShutdownGrace)
		api := n.servers[0]
		sctx, cancel := context.WithTimeout(ctx, n.cfg.ShutdownGrace)
		err := api.Shutdown(sctx)
		cancel()
		if err != nil {
			n.logger.Warn("in-flight turns outlived the shutdown grace; closing their sockets", "err", err)
		}
		n.gw.Close() // cancels remaining turns: they end with "server shutting down"
		if err != nil {
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			// Handlers return promptly once their turns are cancelled.
			if err := api.Shutdown(cctx); err != nil {
				n.logger.Warn("handlers outlived their cancelled turns; closing their connections", "err", err)
			}
			ccancel()
			api.Close()
		}
		for _, s := range n.servers[1:] {
			s.Close()
		}
	} else {
		for _, l := range n.listeners { // never served, or Start failed after Listen
			l.Close()
		}
		if n.gw != nil {
			n.gw.Close()
		}
	}
	if n.pool != nil {
		n.pool.Close()
	}
	if n.adm != nil {
		n.adm.Close()
	}
	if n.credCancel != nil {
		n.credCancel()
		<-n.credDone
	}
	if n.agentCancel != nil {
		n.agentCancel()
		<-n.agentDone // Run returns within agent.GoodbyeTimeout
		<-n.recoverDone
	}
	if n.cp != nil {
		cctx, cancel := context.WithTimeout(ctx, embeddedStopTimeout)
		if err := n.cp.close(cctx); err != nil {
			n.logger.Warn("control plane connection close", "err", err)
		}
		cancel()
	}
	if n.diagnostics != nil {
		n.diagnostics.Close()
	}
	if n.stopTelemetry != nil {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := n.stopTelemetry(tctx); err != nil {
			n.logger.Warn("telemetry shutdown", "err", err)
		}
		cancel()
	}
}

// orBroker names the credential source for the facts page.
func orBroker(codexAuth string) string {
	if codexAuth == "" {
		return "(the control plane's credential broker)"
	}
	return codexAuth
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
