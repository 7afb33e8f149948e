package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/pacing"
	"github.com/clodex/clodex/internal/telemetry"
)

// newNode returns a Node with its logger and notices on stderr, and says
// the environment's notices once each.
func newNode(cfg Config, stderr io.Writer) *Node {
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
	var notices pacing.Notices
	for _, notice := range cfg.Notices {
		notices.Emit(notice, n.notify)
	}
	return n
}

// openDiagnostics opens --ws-diagnostics: nil when off, stderr for "-",
// else the file (closed by Close).
func (n *Node) openDiagnostics(stderr io.Writer) (io.Writer, error) {
	switch n.cfg.WSDiagnostics {
	case "":
		return nil, nil
	case "-":
		return stderr, nil
	}
	f, err := os.OpenFile(n.cfg.WSDiagnostics, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open --ws-diagnostics: %w", err)
	}
	n.diagnostics = f
	return f, nil
}

// listen opens the API listener (served by the gateway) and, with
// --admin-listen, the admin listener (/metrics, /debug/, pprof).
func (n *Node) listen(ctx context.Context, reg *prometheus.Registry, agentID string) error {
	cfg, logger := n.cfg, n.logger
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on --listen %s: %w", cfg.Listen, err)
	}
	ln = n.gw.Listener(ln)
	n.listeners = append(n.listeners, ln)
	n.servers = append(n.servers, &http.Server{
		Handler:           n.gw.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		MaxHeaderBytes:    gateway.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	})
	if cfg.AdminListen == "" {
		return nil
	}
	var adminToken string
	if cfg.MetricsTokenFile != "" {
		tok, warning, err := bearer.ReadFile(cfg.MetricsTokenFile)
		if err != nil {
			return &ConfigError{Err: fmt.Errorf("read --metrics-token-file: %w", err)}
		}
		if warning != "" {
			logger.Warn("--metrics-token-file: " + warning)
		}
		adminToken = tok.Reveal()
	}
	aln, err := lc.Listen(ctx, "tcp", cfg.AdminListen)
	if err != nil {
		return fmt.Errorf("listen on --admin-listen %s: %w", cfg.AdminListen, err)
	}
	n.listeners = append(n.listeners, aln) // closed by Close, even if the handler is refused
	controlPlane, codexAuth := cfg.ControlPlane, cfg.CodexAuth
	if controlPlane == "" {
		controlPlane = "embedded"
	}
	if codexAuth == "" {
		codexAuth = "(the control plane's credential broker)"
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
			"codex_auth":    codexAuth,
			"refresh":       cfg.Refresh,
			"control_plane": controlPlane,
		},
	})
	if err != nil {
		return &ConfigError{Err: err}
	}
	n.servers = append(n.servers, &http.Server{Handler: admin, ReadHeaderTimeout: 10 * time.Second})
	logger.Info("admin listener", "addr", aln.Addr().String())
	return nil
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
