package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// DefaultShutdownGrace bounds GracefulStop before Stop.
const DefaultShutdownGrace = 5 * time.Second

// KeepaliveEnforcement lets data planes ping every 5 s or more, with or
// without an open stream: they ping a quiet connection every 10 s to
// notice a hung replica (admission.Keepalive). gRPC's default (5 min)
// would answer those pings with GOAWAY too_many_pings.
var KeepaliveEnforcement = keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}

// MaxHeaderListSize bounds a request's header list (metadata). Requests
// carry a bearer token, a user agent and trace context: well under 1 KB.
const MaxHeaderListSize = 16 << 10

// streamWorkers is how many goroutines the gRPC server keeps to run
// incoming streams (grpc.NumStreamWorkers); a stream arriving while every
// one is busy gets a goroutine of its own, as without workers. A worker's
// stack stays grown between RPCs: with a new goroutine per RPC, the Admit
// path on the Redis store grew the 2 KB starting stack twice per call
// (runtime.copystack, 8 % of the control plane's CPU at 64 in flight).
// Idle workers cost their stacks only (about 1 MB for 128).
const streamWorkers = 128

// PolicyStore is the per-account state the server reads and changes:
// the small interfaces its consumers declare (PolicyReader and
// PolicyWriter in admin.go, AdaptiveRates in reports.go, StoreInfo).
// *store.Memory and *redisstore.Store implement it. Account returns
// store.ErrNotFound for an unknown key; a change the store cannot record
// now is store.ErrUnavailable.
type PolicyStore interface {
	PolicyReader
	PolicyWriter
	AdaptiveRates
	StoreInfo
}

// StoreInfo says which store serves and whether it is degraded (the
// health service, metrics, GetAccount and ListAccounts).
type StoreInfo interface {
	Info() store.Info
}

// PolicyWatcher is implemented by a store shared by several replicas
// (*redisstore.Store): WatchPolicies registers fn to be called with each key
// whose policy or effective rate another replica changed, and with ""
// when every key may have changed. New registers the server, which pushes
// the changes to its agents.
type PolicyWatcher interface {
	WatchPolicies(fn func(key string))
}

// StoreHealthService is the health service name that reports the store:
// SERVING while it answers, NOT_SERVING while this replica admits from
// its local share. The server's overall health ("") stays SERVING.
const StoreHealthService = "clodex.controlplane.v1.Store"

// Options configures New. Options is copied; New does not keep a pointer
// to it.
type Options struct {
	// Admissions runs admissions. (Required)
	Admissions Admitter
	// Policies reads and changes policies. (Required)
	Policies PolicyStore
	// Agents, when set, is the store's live-agent directory: every
	// replica sharing the store records its agents' streams there, so the
	// live count pushed to agents covers the fleet and an account the
	// agents of another replica serve is known here. *store.Memory and
	// *redisstore.Store implement it. (Optional; default none: the
	// server counts its own agents)
	Agents AgentCounter
	// Roster, when set, holds every agent of the fleet, so that any
	// replica lists them all (ListAgents). *redisstore.Store implements
	// it. (Optional; default none: the server lists its own agents)
	Roster AgentRoster
	// Quotas, when set, keeps the plan usage agents report. *store.Memory
	// and *redisstore.Store implement it. (Optional; default none:
	// reports are dropped and ListQuotas answers Unimplemented)
	Quotas QuotaStore
	// Usage, when set, keeps the usage ledger the agents' usage reports
	// go to. *store.Memory and *redisstore.Store implement it.
	// (Optional; default none: reports are counted in the metrics and
	// acknowledged, and GetUsage answers FailedPrecondition)
	Usage UsageLedger
	// MemberMetrics exports the usage counters by member and account too
	// (clodex_controlplane_usage_member_*_total). (Optional; default
	// false: by account and agent only, so the series stay few)
	MemberMetrics bool
	// PolicyChanges, when set, tells the server about the changes other
	// replicas sharing the store made, which it pushes to its agents.
	// *redisstore.Store implements it. (Optional; default none)
	PolicyChanges PolicyWatcher
	// AdminToken authorizes every RPC. (Required)
	AdminToken bearer.Token
	// AgentToken authorizes every RPC except AdminService. (Required;
	// must differ from AdminToken)
	AgentToken bearer.Token
	// TLS, when set, serves TLS (mutual TLS when it verifies client
	// certificates). (Optional; default plaintext)
	TLS *tls.Config
	// Logger receives the server's logs. (Optional; default discards)
	Logger *slog.Logger
	// Now is the clock. (Optional; default time.Now)
	Now func() time.Time
	// Registerer receives the server's metrics. (Optional; default none)
	Registerer prometheus.Registerer
	// TracerProvider traces RPCs through otelgrpc. (Optional; default the
	// global provider)
	TracerProvider trace.TracerProvider
	// EnableBench registers BenchService, the benchmark's no-op floor.
	// (Optional; default false)
	EnableBench bool
	// ShutdownGrace bounds GracefulStop before Stop. (Optional; default 5s)
	ShutdownGrace time.Duration
	// DrainDelay is how long Serve waits after marking health NOT_SERVING
	// before it stops accepting. (Optional; default 0)
	DrainDelay time.Duration
	// AgentCreds, when set, keeps scoped agent credentials (clodexctl
	// agent create): tokens that may act only for the accounts they name.
	// (Optional; default none)
	AgentCreds AgentCredStore
	// AgentCredChanges, when set, tells the server that another replica
	// sharing the store changed the scoped agent credentials or the
	// members, which it reloads at once (a removal closes the credential's
	// streams here too; the members go to every agent). *redisstore.Store
	// implements it. (Optional; default none: reloaded every FleetTick)
	AgentCredChanges AgentCredWatcher
	// Members, when set, keeps the team's members (clodexctl member
	// create): their key digests, accounts, pins and caps, pushed to every
	// agent of CAPABILITY_VERSION_MEMBERS. *store.LoginFile and
	// *redisstore.Store implement it. (Optional; default none: the member
	// RPCs answer FailedPrecondition and no agent gets a push)
	Members MemberStore
	// MemberBuckets, when set, holds each member's cap, taken before the
	// account's bucket. *store.Memory and *redisstore.Store implement it.
	// (Optional; default none: members have no cap)
	MemberBuckets MemberBuckets
	// Durable, when set, takes snapshots of the store's durable state and
	// restores them (AdminService.Backup and Restore). *redisstore.Store
	// and store.DirState implement it. (Optional; default none: those
	// RPCs answer FailedPrecondition)
	Durable DurableStore
	// BackupSealer seals the backups Backup returns and opens the ones
	// Restore is given (the credential key). (Optional; default none:
	// plain backups, for a control plane without sign-ins)
	BackupSealer store.Sealer
	// Broker, when set, is the credential broker: AdminService's login
	// RPCs and CredentialService are served from it. (Optional; default
	// none: those RPCs answer FailedPrecondition)
	Broker *broker.Broker
	// MaxAccountsPerCredential bounds the accounts one agent credential
	// may register (hello, heartbeat, or an Admit naming its agent); past
	// it the registration is ResourceExhausted. (Optional; default
	// DefaultMaxAccountsPerCredential)
	MaxAccountsPerCredential int
	// ConsoleLinks, when set, issues the web console's sign-in links
	// (CreateConsoleLink). (Optional; default none: the RPC answers
	// FailedPrecondition)
	ConsoleLinks ConsoleLinks
	// FleetTick is how often Serve expires silent agents and applies
	// adaptive raises (pushing the new rates). (Optional; default 1s)
	FleetTick time.Duration
}

// DefaultFleetTick is the default Options.FleetTick.
const DefaultFleetTick = time.Second

// ShutdownReason is the reason agent streams are closed with when the
// server shuts down (an AgentClose, then status Unavailable).
const ShutdownReason = "control plane shutting down"

// Server is the control plane's gRPC server.
type Server struct {
	opts    Options
	log     *slog.Logger
	now     func() time.Time
	auth    *authenticator
	metrics *metrics
	grpc    *grpc.Server
	health  *health.Server

	warnPlaintext sync.Once
	denied        *denials
	accounts      *accountRegistry // accounts registered data planes serve
	notices       pacing.Notices   // one-time operator notices, keyed per account
	agents        *directory       // the agent directory
	scopes        *scopeSet        // scoped agent credentials (Options.AgentCreds)
	members       *memberSet       // the team's members (Options.Members)
	credsDirty    chan struct{}    // size 1: another replica changed the scoped credentials
	streams       sync.WaitGroup   // agent streams' receive loops
	usageMetrics  *usageMetrics    // usage.go
	usageFailLog  *rate.Limiter    // "usage report not stored", once a minute
	quotaView     *quotaView       // quotaview.go: the fleet's plan usage and its recent history

	mu          sync.Mutex // guards the following fields
	streamHooks []func(reason string)
}

var (
	_ controlplanev1.AdmissionServiceServer = (*admissionService)(nil)
	_ controlplanev1.AdminServiceServer     = (*adminService)(nil)
	_ controlplanev1.AgentServiceServer     = (*agentService)(nil)
	_ controlplanev1.BenchServiceServer     = (*benchService)(nil)
)

// New returns a Server ready to Serve. Every invalid option is reported.
// A Server that is never served must be stopped (Stop) to end the gRPC
// server's stream workers.
func New(opts Options) (*Server, error) {
	var errs []error
	if opts.Admissions == nil {
		errs = append(errs, errors.New("field Admissions is required"))
	}
	if opts.Policies == nil {
		errs = append(errs, errors.New("field Policies is required"))
	}
	if opts.AdminToken.IsZero() {
		errs = append(errs, errors.New("field AdminToken is required"))
	}
	if opts.AgentToken.IsZero() {
		errs = append(errs, errors.New("field AgentToken is required"))
	}
	if !opts.AdminToken.IsZero() && opts.AdminToken.Equal(opts.AgentToken) {
		errs = append(errs, errors.New("fields AdminToken and AgentToken must differ"))
	}
	if opts.MaxAccountsPerCredential < 0 {
		errs = append(errs, errors.New("field MaxAccountsPerCredential must not be negative"))
	}
	if opts.ShutdownGrace < 0 || opts.DrainDelay < 0 || opts.FleetTick < 0 {
		errs = append(errs, errors.New("fields ShutdownGrace, DrainDelay and FleetTick must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new control plane server: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ShutdownGrace == 0 {
		opts.ShutdownGrace = DefaultShutdownGrace
	}
	if opts.FleetTick == 0 {
		opts.FleetTick = DefaultFleetTick
	}
	if opts.MaxAccountsPerCredential == 0 {
		opts.MaxAccountsPerCredential = DefaultMaxAccountsPerCredential
	}
	scopes := &scopeSet{store: opts.AgentCreds}
	s := &Server{
		scopes:     scopes,
		members:    &memberSet{store: opts.Members},
		credsDirty: make(chan struct{}, 1),
		opts:       opts,
		log:        opts.Logger.With("component", "controlplane"),
		now:        opts.Now,
		auth:       newAuthenticator(opts.AdminToken, opts.AgentToken, scopes),
	}
	s.denied = newDenials(s.log, opts.Now)
	s.accounts = newAccountRegistry(opts.MaxAccountsPerCredential)
	s.agents = newDirectory(opts.Now, s.log, opts.Agents, opts.Roster)
	s.OnShutdown(s.agents.closeAll)
	s.metrics = newMetrics(opts.Policies, opts.Policies, opts.Now, s.agents)
	s.metrics.all = append(s.metrics.all, s.denied.counter)
	s.usageMetrics, s.usageFailLog, s.quotaView = newUsageMetrics(opts.MemberMetrics), newUsageFailLog(), newQuotaView()
	s.metrics.all = append(s.metrics.all, s.usageMetrics.collectors()...)
	if opts.Registerer != nil {
		if err := s.metrics.register(opts.Registerer); err != nil {
			return nil, fmt.Errorf("new control plane server: register metrics: %w", err)
		}
	}

	var otelOpts []otelgrpc.Option
	if opts.TracerProvider != nil {
		otelOpts = append(otelOpts, otelgrpc.WithTracerProvider(opts.TracerProvider))
	}
	serverOpts := []grpc.ServerOption{
		grpc.InTapHandle(s.tapAuthorize),
		grpc.NumStreamWorkers(streamWorkers),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.ForceServerCodecV2(newRecvCodec()), // each method's own limit (recvlimits.go)
		grpc.MaxHeaderListSize(MaxHeaderListSize),
		grpc.KeepaliveEnforcementPolicy(KeepaliveEnforcement),
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelOpts...)),
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
	}
	if opts.TLS != nil {
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	s.grpc = grpc.NewServer(serverOpts...)
	controlplanev1.RegisterAdmissionServiceServer(s.grpc, &admissionService{s: s})
	controlplanev1.RegisterAdminServiceServer(s.grpc, &adminService{s: s})
	controlplanev1.RegisterAgentServiceServer(s.grpc, &agentService{s: s})
	controlplanev1.RegisterCredentialServiceServer(s.grpc, &credentialService{s: s})
	if opts.EnableBench {
		controlplanev1.RegisterBenchServiceServer(s.grpc, &benchService{})
	}
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	for name := range s.grpc.GetServiceInfo() {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.reportStoreHealth()
	if opts.PolicyChanges != nil {
		opts.PolicyChanges.WatchPolicies(s.policyChanged)
	}
	if opts.AgentCredChanges != nil {
		opts.AgentCredChanges.WatchAgentCreds(s.credsChanged)
	}
	return s, nil
}

// policyChanged pushes a change another replica made to this server's
// agents ("" for every account).
func (s *Server) policyChanged(key string) {
	if key == "" {
		s.agents.pushAll()
		return
	}
	s.agents.push(key)
}

// reportStoreHealth sets StoreHealthService from the store's state.
func (s *Server) reportStoreHealth() {
	st := healthpb.HealthCheckResponse_SERVING
	if s.opts.Policies.Info().Degraded {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.health.SetServingStatus(StoreHealthService, st)
}

// OnShutdown registers hook to run when Serve begins shutting down, before
// GracefulStop: it must end its long-lived streams with the given reason
// so GracefulStop need not wait for them. Hooks run synchronously, in
// registration order. New registers the agent streams' hook first.
func (s *Server) OnShutdown(hook func(reason string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streamHooks = append(s.streamHooks, hook)
}

// Serve serves lis until ctx ends, then shuts down: health NOT_SERVING,
// the drain delay, the shutdown hooks, GracefulStop bounded by the shutdown
// grace, then Stop. It returns nil after a shutdown caused by ctx, and the
// serving error otherwise. A Server serves once. While serving it expires
// silent agents and applies adaptive raises every Options.FleetTick.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	s.checkPlaintext(lis.Addr())
	s.log.InfoContext(ctx, "serving", "addr", lis.Addr().String(), "tls", s.opts.TLS != nil)
	if err := s.reloadScopes(ctx); err != nil {
		s.log.WarnContext(ctx, "scoped agent credentials not loaded yet; retrying every fleet tick", "err", err)
	}
	if err := s.reloadMembers(ctx); err != nil {
		s.log.WarnContext(ctx, "members not loaded yet; retrying every fleet tick", "err", err)
	}
	fleetCtx, stopFleet := context.WithCancel(ctx)
	fleetStopped := make(chan struct{})
	go s.fleetLoop(fleetCtx, fleetStopped)
	defer func() { stopFleet(); <-fleetStopped }()
	errc := make(chan error, 1) // buffered: serveLoop must not block if Serve already returned
	go s.serveLoop(lis, errc)
	select {
	case err := <-errc:
		if err != nil {
			s.agents.closeAll(ShutdownReason)
			s.grpc.Stop()
			s.streams.Wait()
			return fmt.Errorf("serve %s: %w", lis.Addr(), err)
		}
		return nil
	case <-ctx.Done():
	}
	s.shutdown(ctx)
	// nil once GracefulStop or Stop ran; ErrServerStopped when ctx ended
	// before serveLoop began serving.
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve %s: %w", lis.Addr(), err)
	}
	return nil
}

func (s *Server) serveLoop(lis net.Listener, errc chan<- error) {
	errc <- s.grpc.Serve(lis)
}

// shutdown stops the server; every step is bounded.
func (s *Server) shutdown(ctx context.Context) {
	s.log.InfoContext(ctx, "shutting down", "grace", s.opts.ShutdownGrace)
	s.health.Shutdown() // NOT_SERVING for every service
	if s.opts.DrainDelay > 0 {
		t := time.NewTimer(s.opts.DrainDelay)
		<-t.C
	}
	s.mu.Lock()
	hooks := append([]func(string){}, s.streamHooks...)
	s.mu.Unlock()
	for _, h := range hooks {
		h(ShutdownReason)
	}
	force := time.AfterFunc(s.opts.ShutdownGrace, func() {
		s.log.Warn("graceful stop exceeded its grace; stopping", "grace", s.opts.ShutdownGrace)
		s.grpc.Stop()
	})
	s.grpc.GracefulStop()
	force.Stop()
	s.streams.Wait() // agent receive loops end with their streams
}

// Stop stops the server at once, closing every connection.
func (s *Server) Stop() { s.grpc.Stop() }

// checkPlaintext warns once when a TCP listener beyond loopback serves
// without TLS: tokens would cross the network in clear.
func (s *Server) checkPlaintext(addr net.Addr) {
	if s.opts.TLS != nil {
		return
	}
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || tcp.IP.IsLoopback() {
		return
	}
	s.warnPlaintext.Do(func() {
		s.log.Warn("listening beyond loopback without TLS: bearer tokens cross the network in clear; set --tls-cert and --tls-key", "addr", addr.String())
	})
}
