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
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/dataplane/admission"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/tlsconfig"
)

// embeddedTarget is the gRPC target of the embedded control plane; the
// in-process listener ignores it.
const embeddedTarget = "passthrough:///clodex-embedded-controlplane"

// bufconnSize is the in-process listener's buffer per direction.
const bufconnSize = 1 << 20

// controlPlaneConn is the data plane's connection to its control plane:
// a remote one (--control-plane) or one embedded in this process and served
// on an in-process listener. Both are dialed with the same client options.
type controlPlaneConn struct {
	conn *grpc.ClientConn
	// Embedded only: the server and its store, served until stop is called.
	cancel context.CancelFunc
	done   chan struct{} // closed when the embedded server and store have returned
}

// dialOptions are the client options of both paths: the agent token on
// every RPC and otelgrpc client spans.
func dialOptions(tok bearer.Token, creds grpccreds.TransportCredentials, tp trace.TracerProvider) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithPerRPCCredentials(bearer.Credentials(tok)),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp))),
	}
}

// dialRemote connects to --control-plane with the agent token and the TLS
// flags: one connection balancing over every replica the value names
// (admission.ControlPlanes). The connection is lazy: an unreachable
// control plane is not an error here (admission falls back to its local
// bucket).
func dialRemote(cfg *Config, notify func(string), tp trace.TracerProvider) (*controlPlaneConn, error) {
	var tok bearer.Token
	if cfg.AgentTokenFile != "" {
		t, warning, err := bearer.ReadFile(cfg.AgentTokenFile)
		if err != nil {
			return nil, fmt.Errorf("read --agent-token-file: %w", err)
		}
		if warning != "" {
			notify("--agent-token-file: " + warning)
		}
		tok = t
	} else {
		t, err := bearer.Parse(cfg.AgentToken)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvAgentToken, err)
		}
		tok = t
	}
	tlsCfg, err := tlsconfig.Client(cfg.TLSCA, cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, &ConfigError{Err: err}
	}
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = grpccreds.NewTLS(tlsCfg)
	}
	cps, err := admission.ParseControlPlanes(cfg.ControlPlane)
	if err != nil {
		return nil, &ConfigError{Err: fmt.Errorf("--control-plane: %w", err)}
	}
	conn, err := grpc.NewClient(cps.Target, append(dialOptions(tok, creds, tp), cps.DialOptions()...)...)
	if err != nil {
		return nil, &ConfigError{Err: fmt.Errorf("--control-plane %q: %w", cfg.ControlPlane, err)}
	}
	return &controlPlaneConn{conn: conn}, nil
}

// startEmbedded builds the control-plane server with a store holding
// cfg.Policy as the default policy (policies persist under --data-dir when
// given), serves it on an in-process listener with random tokens, and dials
// it like a remote one. ctx only bounds the start; the server runs until
// stop.
func startEmbedded(ctx context.Context, cfg *Config, logger *slog.Logger, reg prometheus.Registerer, tp trace.TracerProvider) (*controlPlaneConn, error) {
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
	lis := bufconn.Listen(bufconnSize)
	dial := func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }
	opts := append(dialOptions(agentTok, insecure.NewCredentials(), tp), admission.DialOption(), grpc.WithContextDialer(dial))
	conn, err := grpc.NewClient(embeddedTarget, opts...)
	if err != nil {
		lis.Close()
		srv.Stop() // never served: ends its stream workers
		return nil, fmt.Errorf("dial the embedded control plane: %w", err)
	}

	// The server outlives ctx on purpose: the data plane stops it last,
	// after its own clients are done with it.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &controlPlaneConn{conn: conn, cancel: cancel, done: make(chan struct{})}
	go c.serveEmbedded(sctx, srv, st, lis, logger)
	return c, nil
}

// serveEmbedded runs the embedded server and its store's sweeps until ctx
// ends; Serve then shuts the server down (GracefulStop bounded by its
// grace, then Stop).
func (c *controlPlaneConn) serveEmbedded(ctx context.Context, srv *controlplane.Server, st *store.Memory, lis net.Listener, logger *slog.Logger) {
	defer close(c.done)
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		if err := st.Run(ctx); err != nil {
			logger.Warn("embedded control plane: store", "err", err)
		}
	}()
	if err := srv.Serve(ctx, lis); err != nil {
		logger.Error("embedded control plane stopped serving", "err", err)
	}
	<-sweepDone
}

// close closes the connection and, for the embedded control plane, stops
// the server and waits for it (bounded by ctx; the server's own grace is
// 5 s before it stops hard).
func (c *controlPlaneConn) close(ctx context.Context) error {
	err := c.conn.Close()
	if c.cancel == nil {
		return err
	}
	c.cancel()
	select {
	case <-c.done:
	case <-ctx.Done():
		return errors.Join(err, fmt.Errorf("stop the embedded control plane: %w", ctx.Err()))
	}
	return err
}

// embeddedStopTimeout bounds the wait for the embedded server in close: its
// GracefulStop grace plus a margin.
const embeddedStopTimeout = controlplane.DefaultShutdownGrace + time.Second
