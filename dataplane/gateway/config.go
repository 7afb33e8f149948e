package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/hostcheck"
	"github.com/clodex/clodex/internal/pacing"
)

// Router is what a turn asks of the accounts: which account it runs on,
// and one refresh of a credential the upstream rejected.
// *accounts.Router implements it.
type Router interface {
	Route(ctx context.Context, heads accounts.Heads, part pool.Partition, items [][]byte) (string, error)
	Rejected(ctx context.Context, key string, token codexauth.Secret) (codexauth.Credential, error)
}

// Defaults for Config.
const (
	DefaultListenAddr   = "127.0.0.1:17645"
	DefaultPingInterval = 20 * time.Second
	DefaultMaxBodyBytes = 50 << 20

	// DefaultBodyGrace, DefaultBodyMinRate and DefaultBodyIdle bound how
	// slowly a request body may arrive: after the grace period the body
	// must have averaged the minimum rate since its first byte was
	// awaited, and no gap between two reads may exceed the idle time.
	DefaultBodyGrace   = 10 * time.Second
	DefaultBodyMinRate = 1 << 10 // bytes per second
	DefaultBodyIdle    = 30 * time.Second

	// MaxHeaderBytes is the API listener's limit on a request's header
	// block (its http.Server.MaxHeaderBytes); Server.Listener answers a
	// larger one with an Anthropic error body.
	MaxHeaderBytes = 1 << 20
)

// Config configures a Server. New copies it and never modifies the
// caller's value.
type Config struct {
	// Router chooses each turn's account and refreshes a credential the
	// upstream rejected (Required).
	Router Router
	// Pool hands out upstream sockets (continuation heads), opens and
	// paces new ones (Required). The gateway does not close it: its owner
	// closes it after Server.Close.
	Pool *pool.Pool
	// Budgets is every account's turn budget: the shared no-data deadline
	// (IdleTimeout), the total deadline (TotalTimeout) and MaxRetries
	// (Optional; default pacing.DefaultBudget() for every account).
	Budgets *retry.Budgets
	// RetryClock is the time source of the retry schedule and deadlines
	// (Optional; default retry.SystemClock). Tests inject a fake.
	RetryClock retry.Clock
	// RetryRand returns uniform values in [0, 1) for retry jitter and the
	// client's retry-after draw (Optional; default math/rand/v2).
	RetryRand func() float64
	// Health is the data plane's memory of failing upstreams: it decides
	// how many retries a turn spends inside the data plane on a failure the
	// client retries itself, and what retry-after the client is told. Give
	// the same Health to the pool (pool.Config.Health), which refuses new
	// sockets to an unreachable upstream at once (Optional; default a
	// private Health with retry.DefaultFailureRetries, whose dials are not
	// gated).
	Health *retry.Health
	// Upstream names the upstream in Health and in messages: the backend's
	// host, upstream.Key of its URL (Optional; default "the upstream").
	Upstream string
	// Ready says whether the data plane can serve a turn now: nil, or why
	// not (its agent credential refused; with the credential broker, no
	// access token held yet). GET /readyz answers 503 with the reason
	// until it is nil, for probes and start-up scripts; /healthz stays the
	// liveness check (Optional; default always ready).
	Ready func() error
	// ListenAddr is the address the Handler is served on (Optional;
	// default DefaultListenAddr). It selects the listener security mode: a
	// loopback host (127.0.0.0/8, ::1, localhost) accepts any key and checks
	// Host and Origin; anything else, including ":port" and 0.0.0.0,
	// requires APIKey.
	ListenAddr string
	// APIKey is the key clients must present on a non-loopback listener
	// (Required there unless Members is set; ignored on loopback).
	APIKey string
	// Members, when set, is the member list every request's key is checked
	// against, on any listener (a data plane started with --member-keys):
	// only a member's key is served, and the member is the turn's
	// (memberOf). (Optional; default none)
	Members MemberKeys
	// AllowedOrigins lists Origin header values that may call the API, e.g.
	// "http://localhost:3000" (Optional; default none: any Origin is
	// refused).
	AllowedOrigins []string
	// Models maps requested model names to upstream models (Optional;
	// default translate.DefaultModels()).
	Models *translate.ModelTable
	// PingInterval is how often a committed stream gets a ping event while
	// the backend works without downstream output (Optional; default 20 s).
	PingInterval time.Duration
	// MaxBodyBytes limits request bodies, before and after decoding
	// (Optional; default 50 MiB).
	MaxBodyBytes int64
	// BodyGrace, BodyMinRate and BodyIdle bound how slowly a request body
	// may arrive (Optional; defaults DefaultBodyGrace, DefaultBodyMinRate
	// bytes per second, DefaultBodyIdle): a body that has not averaged
	// BodyMinRate once BodyGrace has passed, or that pauses longer than
	// BodyIdle, is cut and answered 408. They take effect where the
	// connection supports read deadlines (http.ResponseController).
	BodyGrace   time.Duration
	BodyMinRate int64
	BodyIdle    time.Duration
	// Logger receives one line per request (Optional; default discards).
	Logger *slog.Logger
	// Registry receives the gateway's metrics (Optional; default a new
	// private registry). The data plane serves it on its admin listener.
	Registry *prometheus.Registry
	// TracerProvider creates one span per turn (Optional; default no-op).
	TracerProvider trace.TracerProvider
	// Usage receives each turn's usage for the control plane's ledger
	// (Optional; default none).
	Usage UsageReporter
}

// IsLoopbackAddr reports whether a listen address ("host:port") binds only
// loopback interfaces.
func IsLoopbackAddr(addr string) bool { return hostcheck.LoopbackAddr(addr) }

// validate fills defaults into c (a copy) and reports every problem.
func (c *Config) validate() error {
	var errs []error
	if c.Router == nil {
		errs = append(errs, errors.New("field Router is required"))
	}
	if c.Pool == nil {
		errs = append(errs, errors.New("field Pool is required"))
	}
	if c.Budgets == nil {
		c.Budgets = retry.NewBudgets(pacing.Budget{})
	}
	if c.ListenAddr == "" {
		c.ListenAddr = DefaultListenAddr
	}
	if !IsLoopbackAddr(c.ListenAddr) && strings.TrimSpace(c.APIKey) == "" && c.Members == nil {
		errs = append(errs, fmt.Errorf("field APIKey is required when listening on %s, which is not a loopback address (use 127.0.0.1 or [::1] to run without a key)", c.ListenAddr))
	}
	c.APIKey = strings.TrimSpace(c.APIKey)
	for i, o := range c.AllowedOrigins {
		if _, err := hostcheck.NormalizeOrigin(o); err != nil {
			errs = append(errs, fmt.Errorf("field AllowedOrigins[%d] %q: %w", i, o, err))
		}
	}
	switch {
	case c.PingInterval == 0:
		c.PingInterval = DefaultPingInterval
	case c.PingInterval < 0:
		errs = append(errs, fmt.Errorf("field PingInterval is %v; want a positive duration", c.PingInterval))
	}
	switch {
	case c.MaxBodyBytes == 0:
		c.MaxBodyBytes = DefaultMaxBodyBytes
	case c.MaxBodyBytes < 0:
		errs = append(errs, fmt.Errorf("field MaxBodyBytes is %d; want a positive size", c.MaxBodyBytes))
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{{"BodyGrace", &c.BodyGrace, DefaultBodyGrace}, {"BodyIdle", &c.BodyIdle, DefaultBodyIdle}} {
		switch {
		case *d.v == 0:
			*d.v = d.def
		case *d.v < 0:
			errs = append(errs, fmt.Errorf("field %s is %v; want a positive duration", d.name, *d.v))
		}
	}
	switch {
	case c.BodyMinRate == 0:
		c.BodyMinRate = DefaultBodyMinRate
	case c.BodyMinRate < 0:
		errs = append(errs, fmt.Errorf("field BodyMinRate is %d; want a positive number of bytes per second", c.BodyMinRate))
	}
	if c.Models == nil {
		c.Models = translate.DefaultModels()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.Health == nil {
		c.Health, _ = retry.NewHealth(retry.HealthConfig{Clock: c.RetryClock, Logger: c.Logger})
	}
	if c.Upstream == "" {
		c.Upstream = "the upstream"
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gateway config: %w", err)
	}
	return nil
}
