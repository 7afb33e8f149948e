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
	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/hostcheck"
	"github.com/clodex/clodex/internal/pacing"
)

// CredentialsSource is what the gateway needs from a credential source:
// the current credential, and one refresh after the backend rejected a
// token (a 401). *credentials.RefreshingFile implements it.
type CredentialsSource interface {
	Credential(ctx context.Context) (codexauth.Credential, error)
	// Rejected returns a credential with a different access token, or an
	// error (wrapping credentials.ErrLoginRequired when the user must sign
	// in again).
	Rejected(ctx context.Context, token codexauth.Secret) (codexauth.Credential, error)
}

// AccountCredentials is a CredentialsSource that serves several accounts:
// the credential of a named account (a ChatGPT account id, the pool's
// Partition.Account) and one refresh of its rejected token. With
// Config.Accounts holding more than one account, the gateway gives each
// new conversation an account, whose credential the pool's new sockets
// are then dialled with.
type AccountCredentials interface {
	CredentialFor(ctx context.Context, accountID string) (codexauth.Credential, error)
	RejectedFor(ctx context.Context, accountID string, token codexauth.Secret) (codexauth.Credential, error)
}

// errNoRefresh is returned by NoRefresh's Rejected.
var errNoRefresh = errors.New("the credential source cannot refresh a rejected token")

// NoRefresh adapts a plain credentials.Source (credentials.Static, a
// FileSource) to CredentialsSource: Rejected always fails, so a 401 is
// answered as an authentication failure without a retry.
func NoRefresh(src credentials.Source) CredentialsSource { return noRefresh{src} }

type noRefresh struct{ credentials.Source }

func (noRefresh) Rejected(context.Context, codexauth.Secret) (codexauth.Credential, error) {
	return codexauth.Credential{}, errNoRefresh
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
	// Credentials supplies the upstream credential per turn and answers a
	// 401 with one refresh (Required). A *credentials.RefreshingFile
	// implements it; wrap a plain credentials.Source (credentials.Static)
	// with NoRefresh.
	Credentials CredentialsSource
	// Accounts are the upstream accounts served, with what is known of
	// their limits (Optional). When it holds more than one account and
	// Credentials is an AccountCredentials, each new conversation gets
	// the account Accounts.Pick chooses and keeps it while its head lives
	// (Pool.Holder); a conversation whose account is at its usage limit
	// moves to another at its next turn with one full resend. When every
	// account is at its limit the turn is answered 429 with retry-after
	// the first reset. Otherwise every turn takes Credentials.Credential.
	Accounts *accounts.Set
	// Pool hands out upstream sockets (continuation heads), opens and
	// paces new ones (Required). The gateway does not close it: its owner
	// closes it after Server.Close.
	Pool *pool.Pool
	// Budget bounds every request's attempts: the shared no-data deadline
	// (IdleTimeout), the total deadline (TotalTimeout) and MaxRetries
	// (Optional; the zero value means pacing.DefaultBudget()).
	Budget pacing.Budget
	// BudgetFor returns the budget of a turn on the given upstream account
	// (the credential's AccountID, "" when it has none); it is called once
	// per turn, before the first attempt, and must be safe for concurrent
	// use (Optional; nil means Budget for every turn). A zero or invalid
	// budget it returns (see Budget's checks) is replaced by Budget.
	BudgetFor func(accountID string) pacing.Budget
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
	// ListenAddr is the address the Handler is served on (Optional;
	// default DefaultListenAddr). It selects the listener security mode: a
	// loopback host (127.0.0.0/8, ::1, localhost) accepts any key and checks
	// Host and Origin; anything else, including ":port" and 0.0.0.0,
	// requires APIKey.
	ListenAddr string
	// APIKey is the key clients must present on a non-loopback listener
	// (Required there; ignored on loopback).
	APIKey string
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
}

// IsLoopbackAddr reports whether a listen address ("host:port") binds only
// loopback interfaces.
func IsLoopbackAddr(addr string) bool { return hostcheck.LoopbackAddr(addr) }

// validate fills defaults into c (a copy) and reports every problem.
func (c *Config) validate() error {
	var errs []error
	if c.Credentials == nil {
		errs = append(errs, errors.New("field Credentials is required"))
	}
	if c.Pool == nil {
		errs = append(errs, errors.New("field Pool is required"))
	}
	if c.Budget != (pacing.Budget{}) {
		if err := checkBudget(c.Budget); err != nil {
			errs = append(errs, fmt.Errorf("field Budget %w", err))
		}
	}
	if c.ListenAddr == "" {
		c.ListenAddr = DefaultListenAddr
	}
	if !IsLoopbackAddr(c.ListenAddr) && strings.TrimSpace(c.APIKey) == "" {
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

// checkBudget reports a budget the retry loop cannot run with.
func checkBudget(b pacing.Budget) error {
	var errs []error
	if b.IdleTimeout <= 0 || b.TotalTimeout <= 0 {
		errs = append(errs, fmt.Errorf("has idle timeout %v and total timeout %v; want both positive (or the zero Budget for the default)", b.IdleTimeout, b.TotalTimeout))
	}
	if b.MaxRetries < 0 || b.MaxRetries > pacing.MaxMaxRetries {
		errs = append(errs, fmt.Errorf("has MaxRetries %d; allowed: 0..%d", b.MaxRetries, pacing.MaxMaxRetries))
	}
	return errors.Join(errs...)
}
