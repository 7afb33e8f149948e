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
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"golang.org/x/sync/errgroup"

	"github.com/clodex/clodex/dataplane/admission"
	"github.com/clodex/clodex/dataplane/agent"
	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
	"github.com/clodex/clodex/internal/telemetry"
)

// version is stamped at build time with -ldflags "-X main.version=…".
var version = "dev"

// run starts the data plane and serves until ctx ends, then shuts down in
// the order written in dataplane.close.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runEnv(ctx, args, osLookupEnv, stdout, stderr)
}

// runEnv is run with the environment injected (tests).
func runEnv(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	stderr = &lockedWriter{w: stderr} // shared by the logger, notices and diagnostics
	cfg, err := loadConfig(args, lookupEnv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if cfg.Version {
		fmt.Fprintln(stdout, "clodex-dataplane", version)
		return nil
	}
	d, err := start(ctx, cfg, stdout, stderr)
	if err != nil {
		return err
	}
	return d.serve(ctx)
}

// dataplane is one running data plane: every component it owns, in the
// order start builds them. close tears them down in reverse.
type dataplane struct {
	cfg    *config
	logger *slog.Logger
	notify func(string)

	stopTelemetry func(context.Context) error
	diagnostics   io.Closer // --ws-diagnostics file, or nil
	cp            *controlPlaneConn
	adm           *admission.Client
	ag            *agent.Agent
	agentCancel   context.CancelFunc
	agentDone     chan struct{} // closed when ag.Run has returned
	pool          *pool.Pool
	gw            *gateway.Server
	servers       []*http.Server // servers[0] is the API
	listeners     []net.Listener
	serving       bool // serve has started the servers; set before close can run
}

// start builds the data plane. On failure it closes whatever it built,
// through the same close as a shutdown.
func start(ctx context.Context, cfg *config, stdout, stderr io.Writer) (_ *dataplane, err error) {
	level, _ := parseLevel(cfg.LogLevel)
	d := &dataplane{
		cfg:    cfg,
		logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
		notify: func(msg string) {
			fmt.Fprintln(stderr, "clodex-dataplane:", strings.TrimPrefix(msg, "clodex: "))
		},
	}
	defer func() {
		if err != nil {
			d.close(context.WithoutCancel(ctx))
		}
	}()
	logger := d.logger

	// The environment's notices, once each.
	var notices pacing.Notices
	for _, n := range cfg.Notices {
		notices.Emit(n, d.notify)
	}

	creds, err := credentials.NewFileSource(credentials.FileConfig{
		Path:          cfg.CodexAuth,
		TokenEndpoint: cfg.TokenEndpoint,
		Mode:          cfg.refreshMode(),
		Logger:        logger,
		Notify:        d.notify,
	})
	if err != nil {
		return nil, err
	}
	models, err := translate.ParseModelAliases(cfg.ModelAliases)
	if err != nil {
		return nil, &usageError{msg: fmt.Sprintf("--model-aliases: %v", err)}
	}
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
		diag, d.diagnostics = f, f
	}

	host, _ := os.Hostname()
	agentID := agent.NewID(host, os.Getpid())
	d.stopTelemetry, err = telemetry.Setup(ctx, telemetry.Config{
		ServiceName: "clodex-dataplane",
		Version:     version,
		InstanceID:  agentID,
		LookupEnv:   cfg.lookupEnv,
	})
	if err != nil {
		return nil, fmt.Errorf("set up telemetry: %w", err)
	}
	reg := telemetry.NewRegistry()

	// The control plane: remote, or embedded and reached the same way.
	if cfg.fleet() {
		d.cp, err = dialRemote(cfg, d.notify)
		logger.Info("control plane", "addr", cfg.ControlPlane, "tls", cfg.TLSCA != "" || cfg.TLSCert != "")
	} else {
		d.cp, err = startEmbedded(ctx, cfg, logger, reg)
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
	if cred, err := creds.Credential(ctx); err == nil && cred.AccountID != "" {
		accts.add(account.Key(cred.AccountID))
	}
	d.ag, err = agent.New(agent.Config{
		Conn:     d.cp.conn,
		ID:       agentID,
		Host:     host,
		Version:  version,
		Accounts: accts.keys,
		OnPolicy: func(key string, p pacing.Policy, live int) {
			// The local fallback's policy; d.adm is set before the agent runs.
			if err := d.adm.SetPolicy(key, p); err != nil {
				logger.Warn("policy from the control plane", "account", key, "err", err)
				return
			}
			turnBudgets.set(key, p.Budget)
			logger.Info("policy from the control plane", "account", key, "rate_per_minute", p.RatePerMinute,
				"burst", p.Burst, "live_agents", live, "max_retries", p.Budget.MaxRetries,
				"idle_timeout", p.Budget.IdleTimeout, "total_timeout", p.Budget.TotalTimeout)
		},
		// The control plane is back: admission asks it again at once
		// instead of waiting out its own backoff. d.adm is set before
		// the agent runs.
		OnConnect: func() { d.adm.CentralMaybeBack() },
		Logger:    logger,
	})
	if err != nil {
		return nil, err
	}
	d.adm, err = admission.New(admission.Config{
		Conn:       d.cp.conn,
		AgentID:    agentID,
		Fallback:   cfg.Policy,
		LiveAgents: d.ag.LiveAgents,
		Notify:     d.notify,
		Logger:     logger,
	})
	if err != nil {
		return nil, err
	}
	agentCtx, agentCancel := context.WithCancel(context.WithoutCancel(ctx))
	d.agentCancel, d.agentDone = agentCancel, make(chan struct{})
	go d.runAgent(agentCtx)

	d.pool, err = pool.New(pool.Config{
		Dialer: reporting403(gateway.PoolDialer(upstream.DialOptions{
			URL:     cfg.UpstreamURL,
			Version: version,
			Logger:  logger.With("component", "dataplane/upstream"),
		}, creds), d.ag.Report403),
		Admitter: pool.AdmitterFunc(func(ctx context.Context, accountID string) error {
			key := account.Key(accountID)
			accts.add(key)
			return d.adm.Admit(ctx, key)
		}),
		Logger:                logger,
		Notify:                d.notify,
		MaxConnections:        cfg.MaxConnections,
		MaxNurseryConnections: cfg.MaxNurseryConnections,
		Diagnostics:           diag,
		Registerer:            reg,
	})
	if err != nil {
		return nil, err
	}
	d.gw, err = gateway.New(gateway.Config{
		Credentials:    creds,
		Pool:           d.pool,
		Budget:         cfg.Policy.Budget,
		BudgetFor:      turnBudgets.forAccount,
		ListenAddr:     cfg.Listen,
		APIKey:         apiKey,
		AllowedOrigins: cfg.AllowedOrigins,
		Models:         models,
		Logger:         logger.With("component", "dataplane/gateway"),
		Registry:       reg,
		TracerProvider: otel.GetTracerProvider(),
	})
	if err != nil {
		return nil, err
	}

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on --listen %s: %w", cfg.Listen, err)
	}
	d.listeners = append(d.listeners, ln)
	d.servers = append(d.servers, &http.Server{
		Handler:           d.gw.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	})
	if cfg.AdminListen != "" {
		aln, err := lc.Listen(ctx, "tcp", cfg.AdminListen)
		if err != nil {
			return nil, fmt.Errorf("listen on --admin-listen %s: %w", cfg.AdminListen, err)
		}
		controlPlane := cfg.ControlPlane
		if controlPlane == "" {
			controlPlane = "embedded"
		}
		d.listeners = append(d.listeners, aln)
		d.servers = append(d.servers, &http.Server{
			Handler: telemetry.AdminHandler(reg, map[string]string{
				"version":       version,
				"agent_id":      agentID,
				"listen":        ln.Addr().String(),
				"upstream_url":  cfg.UpstreamURL,
				"codex_auth":    cfg.CodexAuth,
				"refresh":       cfg.Refresh,
				"control_plane": controlPlane,
			}),
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
	return d, nil
}

// runAgent holds the agent's stream until ctx ends (it then says goodbye:
// the data plane deregisters).
func (d *dataplane) runAgent(ctx context.Context) {
	defer close(d.agentDone)
	if err := d.ag.Run(ctx); err != nil {
		d.logger.Warn("agent stream ended", "err", err)
	}
}

// serve serves the listeners until ctx ends or one fails, then closes.
func (d *dataplane) serve(ctx context.Context) error {
	d.serving = true
	g, gctx := errgroup.WithContext(ctx)
	for i := range d.servers {
		srv, l := d.servers[i], d.listeners[i]
		g.Go(func() error {
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", l.Addr(), err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		d.close(context.WithoutCancel(ctx))
		return nil
	})
	return g.Wait()
}

// close is the data plane's shutdown order, written once; every step is
// bounded and skipped when start never built its component:
//
//  1. stop accepting and let in-flight turns finish (http.Server.Shutdown
//     within --shutdown-grace);
//  2. cancel the turns still running (their sockets close with 1001) and
//     close the admin listener;
//  3. close the pool's idle sockets;
//  4. close the admission client;
//  5. stop the agent: it says goodbye, so the control plane drops it now
//     rather than when its heartbeats lapse;
//  6. close the gRPC connection, then stop the embedded control plane
//     (GracefulStop within 5 s, then Stop);
//  7. close the diagnostics file and flush telemetry.
func (d *dataplane) close(ctx context.Context) {
	if d.serving {
		d.logger.Info("shutting down", "grace", d.cfg.ShutdownGrace)
		api := d.servers[0]
		sctx, cancel := context.WithTimeout(ctx, d.cfg.ShutdownGrace)
		err := api.Shutdown(sctx)
		cancel()
		if err != nil {
			d.logger.Warn("in-flight turns outlived the shutdown grace; closing their sockets", "err", err)
		}
		d.gw.Close() // cancels remaining turns: sockets get 1001 "server shutting down"
		if err != nil {
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			api.Shutdown(cctx) // handlers return promptly once their turns are cancelled
			ccancel()
			api.Close()
		}
		for _, s := range d.servers[1:] {
			s.Close()
		}
	} else {
		for _, l := range d.listeners { // start failed between Listen and serving
			l.Close()
		}
		if d.gw != nil {
			d.gw.Close()
		}
	}
	if d.pool != nil {
		d.pool.Close()
	}
	if d.adm != nil {
		d.adm.Close()
	}
	if d.agentCancel != nil {
		d.agentCancel()
		<-d.agentDone // Run returns within agent.GoodbyeTimeout
	}
	if d.cp != nil {
		cctx, cancel := context.WithTimeout(ctx, embeddedStopTimeout)
		if err := d.cp.close(cctx); err != nil {
			d.logger.Warn("control plane connection close", "err", err)
		}
		cancel()
	}
	if d.diagnostics != nil {
		d.diagnostics.Close()
	}
	if d.stopTelemetry != nil {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := d.stopTelemetry(tctx); err != nil {
			d.logger.Warn("telemetry shutdown", "err", err)
		}
		cancel()
	}
}

// reporting403 wraps the pool's dialer so that every upgrade the backend
// refuses with 403 is reported to the control plane through the agent
// (adaptive pacing lowers the account's rate on them).
func reporting403(d pool.Dialer, report func(accountKey string)) pool.Dialer {
	return pool.DialerFunc(func(ctx context.Context, p pool.Partition) (pool.Conn, error) {
		c, err := d.Dial(ctx, p)
		if err != nil {
			var ue *upstream.UpgradeError
			if errors.As(err, &ue) && ue.Status == http.StatusForbidden && p.Account != "" {
				report(account.Key(p.Account))
			}
			return nil, err // never a typed nil inside the interface
		}
		return c, nil
	})
}

// accountSet is the account keys this data plane has served, first seen
// first. It is safe for concurrent use.
type accountSet struct {
	mu   sync.Mutex // guards the following fields
	list []string
	last string // the most recently admitted key
}

func (s *accountSet) add(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = key
	if !slices.Contains(s.list, key) {
		s.list = append(s.list, key)
	}
}

// keys returns a copy of the keys (the agent's Accounts).
func (s *accountSet) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.list)
}

// current is the most recently admitted account, for the startup log.
// With one credential per data plane it is the only one.
func (s *accountSet) current() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// lockedWriter serialises writes to w: the logger, the notices and the
// diagnostics share stderr.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
