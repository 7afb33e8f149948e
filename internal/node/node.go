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
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/upstream"
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
	embedded      *embedded       // the in-process control plane, or nil with --control-plane
	ctl           *control.Client // the one control-plane client
	ctlCancel     context.CancelFunc
	ctlDone       chan struct{} // closed when ctl.Run has returned
	diagnostics   io.Closer     // --ws-diagnostics file, or nil
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
// starts listening, in order: the logger and the one-time notices on
// stderr; telemetry; the accounts' auth.json files (none for a fleet
// member that takes its tokens from the control plane's credential
// broker); the control plane (embedded, or remote) and its one client,
// which runs until Close (a remote control plane that refuses the agent
// token fails the start; one that cannot be reached is said and waited
// for, checkControl); the accounts router; the connection pool, which
// opens new sockets with the router's credentials after the control
// plane's admission, reports every frame to the router and every upgrade
// refused with 403 to the control plane; the gateway; the API and admin
// listeners. When ready it prints the export line for the shell on
// stdout. ctx bounds the start only; the Node runs until Close. On failure
// Start closes whatever it built, through the same Close as a shutdown. A
// bad value in cfg is a *ConfigError.
func Start(ctx context.Context, cfg Config, stdout, stderr io.Writer) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, &ConfigError{Err: err}
	}
	n := newNode(cfg.withDefaults(), stderr)
	defer func() {
		if err != nil {
			n.Close(context.WithoutCancel(ctx))
		}
	}()
	cfg, logger := n.cfg, n.logger

	host, _ := os.Hostname()
	agentID := control.NewID(host, os.Getpid())
	if n.stopTelemetry, err = telemetry.Setup(ctx, telemetry.Config{
		ServiceName: "clodex-dataplane", Version: cfg.Version, InstanceID: agentID, LookupEnv: cfg.LookupEnv,
	}); err != nil {
		return nil, fmt.Errorf("set up telemetry: %w", err)
	}
	tp, reg := cfg.tracerProvider(), telemetry.NewRegistry()

	// The accounts: auth.json files, whose keys are fixed from here on
	// (the control-plane client and the router are told them), or the
	// control plane's credential broker (the control-plane client below).
	var files *accounts.Files
	var keys []string
	if !cfg.brokered() {
		if files, err = accounts.OpenFiles(ctx, cfg.fileConfigs(logger, n.notify)); err != nil {
			return nil, filesError(err)
		}
		keys, _ = files.Accounts(ctx)
	}

	// The control plane: embedded in this process, or remote; reached the
	// same way. Its client pushes each account's turn budget into budgets.
	budgets := retry.NewBudgets(cfg.Policy.Budget)
	cc := control.Config{AgentID: agentID, Host: host, Version: cfg.Version, Fallback: cfg.Policy, Budgets: budgets,
		TracerProvider: tp, Broker: cfg.brokered(), Accounts: keys, Notify: n.notify, Logger: logger,
		UsageFlush: cfg.UsageFlush, Registerer: reg}
	var members *accounts.Members // --member-keys: the list the control plane pushes, every key checked against it
	if cfg.MemberKeys {
		members = accounts.NewMembers()
		cc.Members = members
	}
	if cfg.fleet() {
		err = remoteControl(&cfg, n.notify, &cc)
		logger.Info("control plane", "addr", cfg.ControlPlane, "tls", cc.TLS != nil)
	} else if n.embedded, err = startEmbedded(ctx, &cfg, logger, reg, tp); err == nil {
		cc.Target, cc.Token, cc.Dialer = embeddedTarget, n.embedded.token, n.embedded.dial
		logger.Info("control plane embedded", "data_dir", cfg.DataDir, "default_rate_per_minute", cfg.Policy.RatePerMinute)
	}
	if err != nil {
		return nil, err
	}
	if n.ctl, err = control.New(cc); err != nil {
		return nil, err
	}
	n.runControl(ctx)
	if cfg.fleet() {
		if err := n.checkControl(ctx); err != nil {
			return nil, err
		}
	}

	var src accounts.Source = n.ctl
	if files != nil {
		src = files
	} else {
		logger.Info("credentials from the control plane's credential broker", "addr", cfg.ControlPlane)
	}
	router, err := accounts.NewRouter(accounts.Config{Source: src, Accounts: keys, Reporter: n.ctl, Fleet: n.ctl, Standing: n.ctl, Logger: logger, Registerer: reg,
		UsageLimitHold: cfg.UsageLimitHold})
	if err != nil {
		return nil, err
	}
	health, err := retry.NewHealth(retry.HealthConfig{FailureRetries: cfg.FailureRetries, Clock: cfg.RetryClock,
		Logger: logger.With("component", "dataplane/retry")})
	if err != nil {
		return nil, &ConfigError{Err: fmt.Errorf("--failure-retries: %w", err)}
	}
	diag, err := n.openDiagnostics(stderr)
	if err != nil {
		return nil, err
	}
	if n.pool, err = pool.New(pool.Config{
		Upstream:    upstream.DialOptions{URL: cfg.UpstreamURL, Version: cfg.Version, Logger: logger.With("component", "dataplane/upstream")},
		Credentials: router,
		Admitter:    n.ctl,
		// An upstream known to be unreachable refuses a new socket at once,
		// before admission, so that it does not spend the account's bucket.
		Health:                health,
		OnFrame:               router.Observe,
		OnForbidden:           n.ctl.Report403,
		Logger:                logger,
		Notify:                n.notify,
		MaxConnections:        cfg.MaxConnections,
		MaxNurseryConnections: cfg.MaxNurseryConnections,
		Diagnostics:           diag,
		Registerer:            reg,
	}); err != nil {
		return nil, err
	}
	gc, err := cfg.gatewayConfig()
	if err != nil {
		return nil, err
	}
	gc.Router, gc.Pool, gc.Budgets, gc.Health, gc.Registry, gc.TracerProvider = router, n.pool, budgets, health, reg, tp
	gc.Ready = n.ctl.Ready
	gc.Usage = n.ctl
	gc.Logger = logger.With("component", "dataplane/gateway")
	if members != nil { // a nil *accounts.Members would make a non-nil interface
		gc.Members = members
	}
	if n.gw, err = gateway.New(gc); err != nil {
		return nil, err
	}
	if err := n.listen(ctx, reg, agentID); err != nil {
		return nil, err
	}

	addr := n.Addr()
	switch {
	case cfg.MemberKeys:
		fmt.Fprintf(stdout, "export ANTHROPIC_BASE_URL=http://%s  # clodex-dataplane ready; set ANTHROPIC_API_KEY to your member key (clodexctl member create NAME --out FILE)\n", addr)
	case gateway.IsLoopbackAddr(cfg.Listen):
		fmt.Fprintf(stdout, "export ANTHROPIC_BASE_URL=http://%s  # clodex-dataplane ready; any ANTHROPIC_API_KEY works on loopback\n", addr)
	default:
		fmt.Fprintf(stdout, "export ANTHROPIC_BASE_URL=http://%s  # clodex-dataplane ready; set ANTHROPIC_API_KEY to the key in --api-key-file\n", addr)
	}
	logger.Info("serving", "addr", addr, "upstream", cfg.UpstreamURL, "agent_id", agentID, "accounts", keys, "refresh", cfg.Refresh,
		"member_keys", cfg.MemberKeys)
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
//  4. stop the control-plane client: the agent stream says goodbye, so
//     the control plane drops this data plane now rather than when its
//     heartbeats lapse; then close its connection;
//  5. stop the embedded control plane (GracefulStop within 5 s, then
//     Stop);
//  6. close the diagnostics file and flush telemetry.
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
	if n.ctl != nil {
		n.ctlCancel()
		<-n.ctlDone // Run returns within control.GoodbyeTimeout
		if err := n.ctl.Close(); err != nil {
			n.logger.Warn("control plane connection close", "err", err)
		}
	}
	if n.embedded != nil {
		cctx, cancel := context.WithTimeout(ctx, embeddedStopTimeout)
		if err := n.embedded.stop(cctx); err != nil {
			n.logger.Warn("embedded control plane", "err", err)
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
