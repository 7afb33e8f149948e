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
	"time"

	"go.opentelemetry.io/otel"
	"golang.org/x/sync/errgroup"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/telemetry"
)

// version is stamped at build time with -ldflags "-X main.version=…".
var version = "dev"

// run starts the data plane and serves until ctx ends, then shuts down:
// stop accepting, let in-flight turns finish within --shutdown-grace,
// close what remains with 1001, stop telemetry.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(args, osLookupEnv, stderr)
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
	level, _ := parseLevel(cfg.LogLevel)
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	creds, err := credentials.LoadFile(cfg.CodexAuth)
	if err != nil {
		return err
	}
	models, err := translate.ParseModelAliases(cfg.ModelAliases)
	if err != nil {
		return fmt.Errorf("--model-aliases: %w", err)
	}
	var apiKey string
	if cfg.APIKeyFile != "" {
		if apiKey, err = readAPIKey(cfg.APIKeyFile); err != nil {
			return err
		}
	}

	shutdownTelemetry, err := telemetry.Setup(ctx, telemetry.Config{
		ServiceName: "clodex-dataplane",
		Version:     version,
		LookupEnv:   cfg.lookupEnv,
	})
	if err != nil {
		return fmt.Errorf("set up telemetry: %w", err)
	}
	defer func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdownTelemetry(tctx); err != nil {
			logger.Warn("telemetry shutdown", "err", err)
		}
	}()

	reg := telemetry.NewRegistry()
	gw, err := gateway.New(gateway.Config{
		Credentials: creds,
		Dialer: gateway.UpstreamDialer(upstream.DialOptions{
			URL:     cfg.UpstreamURL,
			Version: version,
			Logger:  logger.With("component", "dataplane/upstream"),
		}),
		ListenAddr:     cfg.Listen,
		APIKey:         apiKey,
		AllowedOrigins: cfg.AllowedOrigins,
		Models:         models,
		Logger:         logger.With("component", "dataplane/gateway"),
		Registry:       reg,
		TracerProvider: otel.GetTracerProvider(),
	})
	if err != nil {
		return err
	}
	defer gw.Close()

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on --listen %s: %w", cfg.Listen, err)
	}
	api := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	servers := []*http.Server{api}
	listeners := []net.Listener{ln}
	if cfg.AdminListen != "" {
		aln, err := lc.Listen(ctx, "tcp", cfg.AdminListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("listen on --admin-listen %s: %w", cfg.AdminListen, err)
		}
		admin := &http.Server{
			Handler: telemetry.AdminHandler(reg, map[string]string{
				"version":      version,
				"listen":       ln.Addr().String(),
				"upstream_url": cfg.UpstreamURL,
				"codex_auth":   cfg.CodexAuth,
			}),
			ReadHeaderTimeout: 10 * time.Second,
		}
		servers = append(servers, admin)
		listeners = append(listeners, aln)
		logger.Info("admin listener", "addr", aln.Addr().String())
	}

	addr := ln.Addr().String()
	if gateway.IsLoopbackAddr(cfg.Listen) {
		fmt.Fprintf(stdout, "export ANTHROPIC_BASE_URL=http://%s  # clodex-dataplane ready; any ANTHROPIC_API_KEY works on loopback\n", addr)
	} else {
		fmt.Fprintf(stdout, "export ANTHROPIC_BASE_URL=http://%s  # clodex-dataplane ready; set ANTHROPIC_API_KEY to the key in --api-key-file\n", addr)
	}
	logger.Info("serving", "addr", addr, "upstream", cfg.UpstreamURL, "account_id", mustAccount(ctx, creds))

	g, gctx := errgroup.WithContext(ctx)
	for i := range servers {
		srv, l := servers[i], listeners[i]
		g.Go(func() error {
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", l.Addr(), err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		return shutdown(context.WithoutCancel(ctx), cfg.ShutdownGrace, gw, servers, logger)
	})
	return g.Wait()
}

// shutdown stops accepting, lets in-flight turns finish within grace, then
// closes the remaining upstream sockets with 1001 and the connections.
func shutdown(ctx context.Context, grace time.Duration, gw *gateway.Server, servers []*http.Server, logger *slog.Logger) error {
	logger.Info("shutting down", "grace", grace)
	sctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	err := servers[0].Shutdown(sctx)
	if err != nil {
		logger.Warn("in-flight turns outlived the shutdown grace; closing their sockets", "err", err)
	}
	gw.Close() // cancels remaining turns: sockets get 1001 "server shutting down"
	if err != nil {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		servers[0].Shutdown(cctx) // handlers return promptly once their turns are cancelled
		servers[0].Close()
	}
	for _, s := range servers[1:] {
		s.Close()
	}
	return nil
}

func mustAccount(ctx context.Context, src credentials.Source) string {
	c, err := src.Credential(ctx)
	if err != nil {
		return ""
	}
	return c.AccountID
}
