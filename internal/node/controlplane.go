package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/test/bufconn"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/tlsconfig"
)

// embeddedTarget is the gRPC target of the embedded control plane; the
// in-process listener ignores it.
const embeddedTarget = "passthrough:///clodex-embedded-controlplane"

// bufconnSize is the in-process listener's buffer per direction.
const bufconnSize = 1 << 20

// remoteControl sets the connection fields of cc for --control-plane: the
// address, the agent token and the TLS flags. The client dials lazily: an
// unreachable control plane is not an error (admission falls back to its
// local bucket).
func remoteControl(cfg *Config, notify func(string), cc *control.Config) error {
	if cfg.AgentTokenFile != "" {
		t, warning, err := bearer.ReadFile(cfg.AgentTokenFile)
		if err != nil {
			return fmt.Errorf("read --agent-token-file: %w", err)
		}
		if warning != "" {
			notify("--agent-token-file: " + warning)
		}
		cc.Token = t
	} else {
		t, err := bearer.Parse(cfg.AgentToken)
		if err != nil {
			return fmt.Errorf("%s: %w", EnvAgentToken, err)
		}
		cc.Token = t
	}
	tlsCfg, err := tlsconfig.Client(cfg.TLSCA, cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return &ConfigError{Err: err}
	}
	cc.Target, cc.TLS = cfg.ControlPlane, tlsCfg
	return nil
}

// embedded is the control plane served in this process on an in-process
// listener, until stop.
type embedded struct {
	lis    *bufconn.Listener
	token  bearer.Token // the agent token it accepts
	cancel context.CancelFunc
	done   chan struct{} // closed when the server and its store have returned
}

// dial opens a connection to the in-process listener (control.Config.Dialer).
func (e *embedded) dial(ctx context.Context, _ string) (net.Conn, error) {
	return e.lis.DialContext(ctx)
}

// startEmbedded builds the control-plane server with a store holding
// cfg.Policy as the default policy (policies persist under --data-dir when
// given) and serves it on an in-process listener with random tokens. ctx
// only bounds the start; the server runs until stop.
func startEmbedded(ctx context.Context, cfg *Config, logger *slog.Logger, reg prometheus.Registerer, tp trace.TracerProvider) (*embedded, error) {
	if cfg.DataDir != "" {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("create --data-dir: %w", err)
		}
	}
	defaults := cfg.Policy
	st, err := store.Open(store.Options{Dir: cfg.DataDir, Defaults: &defaults})
	if err != nil {
		return nil, fmt.Errorf("open the embedded control plane's --data-dir: %w", err)
	}
	adminTok, err := bearer.Parse(rand.Text())
	if err != nil {
		return nil, fmt.Errorf("embedded control plane: admin token: %w", err)
	}
	agentTok, err := bearer.Parse(rand.Text())
	if err != nil {
		return nil, fmt.Errorf("embedded control plane: agent token: %w", err)
	}
	srv, err := controlplane.New(controlplane.Options{
		Admissions:     st,
		Policies:       st,
		Agents:         st,
		Quotas:         st,
		Usage:          st,
		AdminToken:     adminTok,
		AgentToken:     agentTok,
		Logger:         logger.With("embedded", true),
		Registerer:     reg,
		TracerProvider: tp,
		ShutdownGrace:  controlplane.DefaultShutdownGrace,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded control plane: %w", err)
	}
	// The server outlives ctx on purpose: the data plane stops it last,
	// after its own client is done with it.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e := &embedded{lis: bufconn.Listen(bufconnSize), token: agentTok, cancel: cancel, done: make(chan struct{})}
	go e.serve(sctx, srv, st, logger)
	return e, nil
}

// serve runs the embedded server and its store's sweeps until ctx ends;
// Serve then shuts the server down (GracefulStop bounded by its grace,
// then Stop).
func (e *embedded) serve(ctx context.Context, srv *controlplane.Server, st *store.Memory, logger *slog.Logger) {
	defer close(e.done)
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		if err := st.Run(ctx); err != nil {
			logger.Warn("embedded control plane: store", "err", err)
		}
	}()
	if err := srv.Serve(ctx, e.lis); err != nil {
		logger.Error("embedded control plane stopped serving", "err", err)
	}
	<-sweepDone
}

// stop stops the server and waits for it (bounded by ctx; the server's
// own grace is 5 s before it stops hard).
func (e *embedded) stop(ctx context.Context) error {
	e.cancel()
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop the embedded control plane: %w", ctx.Err())
	}
}

// embeddedStopTimeout bounds the wait for the embedded server in stop:
// its GracefulStop grace plus a margin.
const embeddedStopTimeout = controlplane.DefaultShutdownGrace + time.Second

// runControl runs the control-plane client (its agent stream, the
// hand-over of local grants, the broker's tokens) until Close cancels it.
func (n *Node) runControl(ctx context.Context) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n.ctlCancel, n.ctlDone = cancel, make(chan struct{})
	go n.controlLoop(cctx)
}

// controlLoop is the control-plane client's goroutine (owned by the Node:
// Close waits for it).
func (n *Node) controlLoop(ctx context.Context) {
	defer close(n.ctlDone)
	if err := n.ctl.Run(ctx); err != nil {
		n.logger.Warn("control-plane client ended", "err", err)
	}
}

// controlCheckTimeout bounds the wait for a remote control plane's first
// answer at start.
const controlCheckTimeout = 10 * time.Second

// checkControl waits for the remote control plane's answer to the agent
// stream: a control plane that refuses the agent token fails the start
// (it would refuse every turn); one that cannot be reached, or does not
// answer within controlCheckTimeout, is said, and the data plane starts
// anyway, admitting locally and asking it again (the token is judged
// when it answers).
func (n *Node) checkControl(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, controlCheckTimeout)
	defer cancel()
	err := n.ctl.Accepted(cctx)
	var refused *control.AgentRefusedError
	switch {
	case err == nil:
		n.logger.Info("the control plane accepts this data plane's agent token", "addr", n.cfg.ControlPlane)
		return nil
	case errors.As(err, &refused):
		return fmt.Errorf("%w; check --agent-token-file (or %s) and --control-plane: a credential removed with clodexctl agent remove needs a new one (clodexctl agent create)", refused, EnvAgentToken)
	case ctx.Err() != nil:
		return fmt.Errorf("start: %w", ctx.Err())
	}
	n.logger.Warn("control plane not reachable yet; serving with local admission and waiting for it", "addr", n.cfg.ControlPlane, "err", err.Error())
	n.notify(err.Error() + ": serving with local admission at this host's share of each account's policy, and waiting for it; the agent token is checked when it answers")
	return nil
}
