package control

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// CapabilityVersion is the protocol version the data plane implements (the
// agent stream, admission and the broker's tokens); it is sent in every
// hello. The numbers and their history are controlplanev1.CapabilityVersion
// (proto/clodex/controlplane/v1/agent.proto).
const CapabilityVersion = int(controlplanev1.CapabilityVersion_CAPABILITY_VERSION_USAGE)

const (
	// DefaultTimeout bounds each Admit, Cancel and ReportGrants RPC.
	DefaultTimeout = 250 * time.Millisecond
	// DefaultHeartbeat is the default interval between heartbeats.
	DefaultHeartbeat = 5 * time.Second
	// LiveWindow is how long the control plane counts an agent live after
	// its last heartbeat; Config.Heartbeat must be shorter.
	LiveWindow = 15 * time.Second
	// MinBackoff is the first delay before a local client asks the control
	// plane again, and before the agent stream reconnects; each failed
	// attempt doubles it up to MaxBackoff. Delays are jittered by ±20 %.
	MinBackoff = 250 * time.Millisecond
	// MaxBackoff caps those delays (and the connection's own reconnect
	// backoff). It is short so that a fleet comes back to central
	// admission within about 2 s of a control plane restart: until every
	// host is back, the hosts that are admit at the restarted bucket's full
	// rate while the others still admit at their local share, which
	// together exceed the account's rate.
	MaxBackoff = 2 * time.Second
	// GoodbyeTimeout bounds the wait for the control plane to end the
	// stream after the goodbye.
	GoodbyeTimeout = time.Second
	// jitterFraction spreads each backoff uniformly over ±20 %.
	jitterFraction = 0.2
	// maxIDLen is the longest agent id the control plane accepts.
	maxIDLen = 128
)

// Config configures New. New copies it and never modifies it.
type Config struct {
	// Target is the control plane: a --control-plane value
	// (ParseControlPlanes) or, with Dialer, a gRPC target used as given
	// ("passthrough:///clodex-embedded-controlplane"). (Required)
	Target string
	// Dialer, when set, opens the connection's transports instead of the
	// network: the embedded control plane's in-process listener. Every
	// other option is the same. (Optional)
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
	// Token is the agent token, sent on every RPC. (Required)
	Token bearer.Token
	// TLS is the client's TLS configuration (internal/tlsconfig.Client);
	// nil dials plaintext. (Optional)
	TLS *tls.Config
	// TracerProvider makes every RPC's client span (otelgrpc), a child of
	// the caller's span. (Optional; default otel.GetTracerProvider())
	TracerProvider trace.TracerProvider

	// AgentID names this process uniquely in the fleet (NewID builds
	// one): 1..128 printable ASCII bytes without spaces. It prefixes the
	// hand-over's report ids. (Required)
	AgentID string
	// Host is the host name shown by clodexctl agents. (Optional)
	Host string
	// Version is the data plane's release string. (Optional)
	Version string
	// Heartbeat is the interval between heartbeats; below LiveWindow.
	// (Optional; default 5s)
	Heartbeat time.Duration
	// Timeout bounds each Admit, Cancel and ReportGrants RPC. (Optional;
	// default 250ms)
	Timeout time.Duration
	// Fallback is the local bucket's policy for an account whose policy
	// was never pushed, and its turn budget (Budget): normally
	// pacing.PolicyFromEnv's result. The zero Policy means
	// pacing.DefaultPolicy(). (Optional)
	Fallback pacing.Policy

	// Budgets receives each account's turn budget as the control plane
	// pushes it. (Optional)
	Budgets *retry.Budgets

	// Broker makes the data plane take its tokens from the control
	// plane's credential broker (Accounts, Credential, Rejected; Run keeps
	// them fresh). (Optional; default off: the tokens are in auth.json
	// files, read elsewhere)
	Broker bool
	// Members, when set, receives the member list the control plane
	// pushes (capability 6), which a data plane serving member keys checks
	// every key against. (Optional; default none: pushes are ignored)
	Members *accounts.Members

	// Accounts are the account keys this data plane serves, named in the
	// hello and every heartbeat: the keys of its auth.json files or, with
	// Broker, the accounts to take tokens of (empty: the broker's answer
	// to ServedAccounts). Duplicates are dropped. (Optional)
	Accounts []string

	// UsageFlush is how often the agent stream sends the usage recorded
	// since the last batch (ReportUsage). (Optional; default 10s)
	UsageFlush time.Duration
	// Registerer receives clodex_dataplane_usage_dropped_turns_total and
	// clodex_dataplane_usage_unacked_batches. (Optional; default none)
	Registerer prometheus.Registerer

	// Notify receives one-time user notices (the switch to local
	// admission and back, a control plane that rejects this data plane).
	// It runs synchronously, outside every lock. (Optional; default none)
	Notify func(msg string)
	// Logger receives the client's logs, never a token. (Optional;
	// default discards)
	Logger *slog.Logger
	// Clock is the time source of the local buckets, the probe backoff,
	// the live-agent window, 403 report stamps and token expiry.
	// (Optional; default time.Now)
	Clock func() time.Time
	// Sleep waits d or until ctx ends, returning ctx.Err() in that case:
	// the granted delays of Admit. (Optional; default a timer)
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand returns a uniform value in [0, 1) for the backoff jitter.
	// (Optional; default math/rand/v2)
	Rand func() float64
}

// Validate reports every invalid field at once.
func (cfg *Config) Validate() error {
	var errs []error
	switch {
	case strings.TrimSpace(cfg.Target) == "":
		errs = append(errs, errors.New("field Target is required: the control plane's address"))
	case cfg.Dialer == nil:
		if _, err := ParseControlPlanes(cfg.Target); err != nil {
			errs = append(errs, fmt.Errorf("field Target: %w", err))
		}
	}
	if cfg.Token.IsZero() {
		errs = append(errs, errors.New("field Token is required: the agent token"))
	}
	if err := ValidateID(cfg.AgentID); err != nil {
		errs = append(errs, fmt.Errorf("field AgentID: %w", err))
	}
	if cfg.Heartbeat < 0 || cfg.Heartbeat >= LiveWindow {
		errs = append(errs, fmt.Errorf("field Heartbeat %v is invalid; allowed 0 (default %v) or more, below the %v liveness window", cfg.Heartbeat, DefaultHeartbeat, LiveWindow))
	}
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("field Timeout %v is negative; want 0 (default %v) or more", cfg.Timeout, DefaultTimeout))
	}
	if cfg.UsageFlush < 0 {
		errs = append(errs, fmt.Errorf("field UsageFlush %v is negative; want 0 (default %v) or more", cfg.UsageFlush, DefaultUsageFlush))
	}
	if cfg.Fallback != (pacing.Policy{}) {
		if err := cfg.Fallback.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("field Fallback: %w", err))
		}
	}
	for i, k := range cfg.Accounts {
		if !account.IsKey(k) {
			errs = append(errs, fmt.Errorf("field Accounts[%d]: %w", i, ErrInvalidKey))
		}
	}
	return errors.Join(errs...)
}

// Client is the data plane's one client of the control plane. It is safe
// for concurrent use.
type Client struct {
	conn      *grpc.ClientConn // over the replicas whose store is healthy
	stores    services         // over conn
	shareConn *grpc.ClientConn // over every replica that serves admission (shares.go)
	shares    services         // over shareConn
	target    string           // Config.Target, for messages
	id        string
	host      string
	version   string
	heartbeat time.Duration
	timeout   time.Duration
	fallback  pacing.Policy
	budgets   *retry.Budgets
	members   *accounts.Members // Config.Members; nil: none
	broker    bool
	fixed     []string // Config.Accounts, sorted and distinct; nil when none
	now       func() time.Time
	sleep     func(ctx context.Context, d time.Duration) error
	notify    func(msg string)
	rand      func() float64
	log       *slog.Logger // scoped: component and agent id
	pushLog   *slog.Logger // Config.Logger as given: the policy push line keeps the form operators and tests grep

	reportPrefix string             // hand-over report ids are reportPrefix-gN
	notices      pacing.Notices     // one-time notices other than the mode switches
	rejectedLog  rate.Sometimes     // limits "control plane rejected" logs
	reported     chan struct{}      // size 1: a 403 or rate-limits report was queued
	answered     chan struct{}      // size 1: the control plane answered while admission was local
	flight       singleflight.Group // one broker RPC per account (and one ServedAccounts) at a time
	closeOnce    sync.Once
	closeErr     error

	refused   atomic.Pointer[AgentRefusedError] // the control plane refuses the agent credential (refused.go)
	first     chan struct{}                     // closed once the first agent stream had an answer (Accepted)
	firstOnce sync.Once
	firstErr  error // Accepted's answer; written once, before first is closed

	mu       sync.Mutex // guards the following fields (admission and reachability)
	closed   bool
	reach    reach                    // reachable.go
	policies map[string]pacing.Policy // pushed on the agent stream
	paused   map[string]time.Time     // pauses pushed on the agent stream
	buckets  map[string]*localBucket  // this outage's buckets; emptied by each fallback
	// memberBuckets are the members' local caps, by name; emptied by each
	// fallback.
	memberBuckets map[string]*pacing.Bucket
	tally         map[string]*grantTally // local grants not yet in a report (the hand-over)
	pending       []*pendingReport       // reports not yet confirmed, oldest first
	reportSeq     uint64
	reporting     bool // a hand-over is in flight
	stats         Stats

	streamMu sync.Mutex // guards the following fields (the agent stream)
	reports  map[string]report
	limits   map[string]*controlplanev1.RateLimits // the latest unsent per account
	live     map[string]*liveCount
	reason   string                                // the last close reason the control plane gave
	fleet    map[string]*controlplanev1.RateLimits // the fleet's plan usage the control plane pushed (usage.go)

	usageFlush   time.Duration
	sessions     atomic.Uint64      // counts agent streams (usage batches record the one they were sent on)
	usageDrops   prometheus.Counter // nil without Config.Registerer
	usageDropLog rate.Sometimes
	usageMu      sync.Mutex // guards the following fields (usage.go)
	usageRows    map[usageKey]*controlplanev1.UsageRow
	usageBatches []*usageBatch // waiting for their acks, oldest first
	usageSeq     uint64
	usageMinute  int64 // the minute of the last ReportUsage (Unix ms)
	usageStats   UsageStats
	// usagePerMinute counts usageRows' rows per minute.
	usagePerMinute map[int64]int

	tokensMu sync.Mutex // guards the following fields (the broker's tokens)
	learned  []string   // the broker's ServedAccounts answer; nil until learned
	tokens   map[string]entry
	waiting  bool // the broker could not supply a token and "waiting" was logged
}

// New checks cfg and returns a Client whose connection is dialed lazily:
// an unreachable control plane is not an error here (admission decides
// locally until it answers). It starts no goroutine.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new control-plane client: %w", err)
	}
	conn, err := dial(&cfg, StoreHealthService)
	if err != nil {
		return nil, fmt.Errorf("new control-plane client: %w", err)
	}
	shareConn, err := dial(&cfg, AdmissionHealthService)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("new control-plane client: %w", err)
	}
	// The shares' connection carries no RPC until the shared store goes
	// away, so it connects now (and never idles, below): api and
	// answering ask whether it has a replica ready, which a connection
	// left idle never would.
	shareConn.Connect()
	c := &Client{
		conn:           conn,
		stores:         newServices(conn),
		shareConn:      shareConn,
		shares:         newServices(shareConn),
		target:         cfg.Target,
		id:             cfg.AgentID,
		host:           cfg.Host,
		version:        cfg.Version,
		heartbeat:      orDefault(cfg.Heartbeat, DefaultHeartbeat),
		timeout:        orDefault(cfg.Timeout, DefaultTimeout),
		fallback:       cfg.Fallback,
		budgets:        cfg.Budgets,
		members:        cfg.Members,
		broker:         cfg.Broker,
		now:            cfg.Clock,
		sleep:          cfg.Sleep,
		notify:         cfg.Notify,
		rand:           cfg.Rand,
		reportPrefix:   reportPrefix(cfg.AgentID),
		rejectedLog:    rate.Sometimes{First: 3, Interval: time.Minute},
		reported:       make(chan struct{}, 1),
		answered:       make(chan struct{}, 1),
		first:          make(chan struct{}),
		policies:       make(map[string]pacing.Policy),
		paused:         make(map[string]time.Time),
		buckets:        make(map[string]*localBucket),
		memberBuckets:  make(map[string]*pacing.Bucket),
		tally:          make(map[string]*grantTally),
		reports:        make(map[string]report),
		limits:         make(map[string]*controlplanev1.RateLimits),
		live:           make(map[string]*liveCount),
		tokens:         make(map[string]entry),
		fleet:          make(map[string]*controlplanev1.RateLimits),
		usageFlush:     orDefault(cfg.UsageFlush, DefaultUsageFlush),
		usageDropLog:   rate.Sometimes{First: 1, Interval: time.Minute},
		usageRows:      make(map[usageKey]*controlplanev1.UsageRow),
		usagePerMinute: make(map[int64]int),
	}
	if len(cfg.Accounts) > 0 {
		c.fixed = slices.Compact(slices.Sorted(slices.Values(cfg.Accounts)))
	}
	if c.fallback == (pacing.Policy{}) {
		c.fallback = pacing.DefaultPolicy()
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.sleep == nil {
		c.sleep = sleep
	}
	if c.notify == nil {
		c.notify = func(string) {}
	}
	if c.rand == nil {
		c.rand = rand.Float64
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c.log = logger.With("component", "dataplane/control", "agent_id", cfg.AgentID)
	c.pushLog = logger
	if cfg.Registerer != nil {
		if err := c.registerUsageMetrics(cfg.Registerer); err != nil {
			_ = conn.Close()
			_ = shareConn.Close()
			return nil, fmt.Errorf("new control-plane client: register metrics: %w", err)
		}
	}
	return c, nil
}

// orDefault returns d, or def when d is zero.
func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// dial builds a connection: TLS or plaintext, the agent token on every
// RPC, otelgrpc client spans, and the options of ControlPlanes (balancing
// over the replicas whose health service health reports SERVING, retries,
// keepalive, reconnect backoff), for a remote control plane and the
// embedded one alike.
func dial(cfg *Config, health string) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	cps := ControlPlanes{Target: cfg.Target}
	if cfg.Dialer == nil {
		cps, _ = ParseControlPlanes(cfg.Target) // checked by Validate
	}
	opts := append([]grpc.DialOption{
		grpc.WithIdleTimeout(0), // a connection without RPCs stays connected (the shares' waits for an outage)
		grpc.WithTransportCredentials(creds),
		grpc.WithPerRPCCredentials(bearer.Credentials(cfg.Token)),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp))),
	}, dialOptions(cps, health)...)
	if cfg.Dialer != nil {
		opts = append(opts, grpc.WithContextDialer(cfg.Dialer))
	}
	conn, err := grpc.NewClient(cps.Target, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial the control plane %q: %w", cfg.Target, err)
	}
	return conn, nil
}

// Run holds the agent stream until ctx ends (reconnecting with backoff;
// it says goodbye on the way out), hands the outage's local grants over
// each time the control plane answers again, and with Config.Broker keeps
// the broker's tokens fresh. It returns nil once every goroutine it
// started has exited. Call it once.
func (c *Client) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { c.streamLoop(ctx); return nil })
	g.Go(func() error { c.handOverLoop(ctx); return nil })
	if c.broker {
		g.Go(func() error { c.tokenLoop(ctx); return nil })
	}
	return g.Wait()
}

// Close makes every later Admit return ErrClosed and closes the
// connection. Call it after Run has returned. Close is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.closeErr = errors.Join(c.conn.Close(), c.shareConn.Close())
	})
	return c.closeErr
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// served returns the account keys of the hello and heartbeats: the
// configured ones, or with the broker the accounts it serves this data
// plane (none until learned).
func (c *Client) served() []string {
	if c.fixed != nil || !c.broker {
		return c.fixed
	}
	c.tokensMu.Lock()
	defer c.tokensMu.Unlock()
	return slices.Clone(c.learned)
}

// ValidateID checks an agent id: 1..128 printable ASCII bytes without
// spaces.
func ValidateID(id string) error {
	if id == "" {
		return errors.New("agent id is empty; want 1..128 printable ASCII bytes without spaces, such as NewID's host-pid-random")
	}
	if len(id) > maxIDLen {
		return fmt.Errorf("agent id is %d bytes; allowed 1..%d", len(id), maxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("agent id %q has a byte 0x%02x at %d; allowed printable ASCII without spaces", id, c, i)
		}
	}
	return nil
}

// NewID returns a process-unique agent id, "host-pid-random" (8 random hex
// digits). Bytes of host other than letters, digits, '.', '_' and '-'
// become '_', and host is cut to 64 bytes.
func NewID(host string, pid int) string {
	var b strings.Builder
	for i := 0; i < len(host) && b.Len() < 64; i++ {
		c := host[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		b.WriteString("host")
	}
	var r [4]byte
	_, _ = crand.Read(r[:])
	return fmt.Sprintf("%s-%d-%s", b.String(), pid, hex.EncodeToString(r[:]))
}
