// Package controlplanetest runs the real control-plane server on a loopback
// listener for tests:
//
//	s := controlplanetest.Start(t, &controlplanetest.Options{}) // temporary token files and data directory
//	cc := s.Dial(agentToken, nil)                               // a client connection per role
//	s.Register(keys...)                                         // accounts a data plane would register
//	s.Restart()                                                 // same port, same data directory; Kill, Stop
//
// With Options.RedisURL the server is a replica over that Redis (start
// several with the same URL and prefix for replicas sharing one store).
// WriteCerts writes a test CA and certificates; MountTmpfs and Remount
// give a data directory that fills up or turns read-only (Linux, root).
package controlplanetest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/redisstore"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Options configures Start. A nil *Options uses every default.
type Options struct {
	// Now is the server's clock. (Optional; default time.Now)
	Now func() time.Time
	// Defaults is the policy for new accounts. (Optional; default
	// pacing.DefaultPolicy())
	Defaults *pacing.Policy
	// TLS is the server's TLS configuration. (Optional; default plaintext)
	TLS *tls.Config
	// EnableBench registers BenchService. (Optional)
	EnableBench bool
	// Logger receives the server's logs. (Optional; default discards)
	Logger *slog.Logger
	// Registerer receives the server's metrics on every start; a restart
	// unregisters nothing, so pass a fresh registry per Start or none.
	// (Optional)
	Registerer prometheus.Registerer
	// ShutdownGrace bounds GracefulStop. (Optional; default 5s)
	ShutdownGrace time.Duration
	// FleetTick is how often the server expires silent agents and applies
	// adaptive raises. (Optional; default 1s)
	FleetTick time.Duration
	// MemberMetrics exports the usage counters by member too. (Optional)
	MemberMetrics bool
	// RedisURL, when set, serves from a Redis store at this URL instead
	// of the memory store. (Optional)
	RedisURL string
	// RedisPrefix is the Redis store's key prefix; replicas of one store
	// share it. (Optional; default redisstore.DefaultPrefix)
	RedisPrefix string
	// RedisTimeout is the Redis store's per-call deadline. (Optional;
	// default redisstore.DefaultTimeout)
	RedisTimeout time.Duration
	// RedisTick is the Redis store's tick (replica registration, clock,
	// version check). (Optional; default 1s)
	RedisTick time.Duration
	// Replica names the Redis replica. (Optional)
	Replica string
	// Broker runs the credential broker with a random credential key
	// (kept across Restart), its logins in the data directory or in Redis.
	// (Optional)
	Broker bool
	// CredentialKey, when set with Broker, is the broker's key instead of
	// a random one (replicas sharing sign-ins share it). (Optional)
	CredentialKey *broker.Key
	// TokenEndpoint is the broker's OAuth token endpoint. (Optional;
	// default the real issuer's)
	TokenEndpoint string
	// Tokens, when set, makes the server use the same admin and agent
	// tokens (and token files) as that server: replicas a data plane
	// balances over share them. (Optional; default new random tokens)
	Tokens *Server
}

// Server is a running control plane.
type Server struct {
	// Addr is the listener's address ("127.0.0.1:port"); it stays the same
	// across Restart.
	Addr string
	// AdminToken and AgentToken are the server's tokens; the files hold
	// the same values with mode 0600.
	AdminToken, AgentToken         bearer.Token
	AdminTokenFile, AgentTokenFile string
	// DataDir holds the policy file (and the broker's logins).
	DataDir string
	// CredentialKey is the broker's key (Options.Broker).
	CredentialKey broker.Key

	t    testing.TB
	opts Options

	mu    sync.Mutex // guards the following fields
	store servedStore
	srv   *controlplane.Server
	// registered are the key lists Register registered, again after a
	// Restart.
	registered [][]string
	cancel     context.CancelFunc
	done       chan error
}

// Start starts a server and stops it when the test ends.
func Start(t testing.TB, opts *Options) *Server {
	t.Helper()
	var o Options
	if opts != nil {
		o = *opts
	}
	dir := t.TempDir()
	s := &Server{t: t, opts: o, DataDir: filepath.Join(dir, "data")}
	if err := os.Mkdir(s.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if o.Tokens != nil {
		s.AdminToken, s.AdminTokenFile = o.Tokens.AdminToken, o.Tokens.AdminTokenFile
		s.AgentToken, s.AgentTokenFile = o.Tokens.AgentToken, o.Tokens.AgentTokenFile
	} else {
		s.AdminToken, s.AdminTokenFile = newToken(t, dir, "admin.token")
		s.AgentToken, s.AgentTokenFile = newToken(t, dir, "agent.token")
	}
	if o.Broker {
		k, _, err := broker.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		s.CredentialKey = k
		if o.CredentialKey != nil {
			s.CredentialKey = *o.CredentialKey
		}
	}
	s.start("127.0.0.1:0")
	t.Cleanup(s.Stop)
	return s
}

func newToken(t testing.TB, dir, name string) (bearer.Token, string) {
	t.Helper()
	tok, err := bearer.Parse(hex.EncodeToString(randBytes(16)))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(tok.Reveal()+"\n"), bearer.FileMode); err != nil {
		t.Fatal(err)
	}
	return tok, path
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func (s *Server) start(addr string) {
	t := s.t
	t.Helper()
	var st servedStore
	now := s.opts.Now
	var closeStore func()
	var logins interface {
		broker.Logins
		controlplane.AgentCredStore
		controlplane.MemberStore
	}
	var roster controlplane.AgentRoster    // Redis only
	var changes controlplane.PolicyWatcher // Redis only

	var credChanges controlplane.AgentCredWatcher // Redis only
	var durable controlplane.DurableStore
	if s.opts.RedisURL != "" {
		r, err := redisstore.Open(context.Background(), redisstore.Options{
			URL: s.opts.RedisURL, Prefix: s.opts.RedisPrefix, Defaults: s.opts.Defaults, Now: s.opts.Now, Registerer: s.opts.Registerer,
			Timeout: s.opts.RedisTimeout, Tick: s.opts.RedisTick, Replica: s.opts.Replica, Logger: s.opts.Logger,
		})
		if err != nil {
			t.Fatalf("controlplanetest: %v", err)
		}
		st, closeStore, logins, roster, changes, durable = r, func() { _ = r.Close() }, r, r, r, r
		credChanges = r
		if now == nil {
			now = r.Now
		}
	} else {
		m, err := store.Open(store.Options{Dir: s.DataDir, Defaults: s.opts.Defaults, Now: s.opts.Now})
		if err != nil {
			t.Fatalf("controlplanetest: %v", err)
		}
		st, closeStore = m, func() {}
	}
	if logins == nil {
		f, err := store.OpenLogins(s.DataDir)
		if err != nil {
			t.Fatalf("controlplanetest: %v", err)
		}
		logins = f
		durable = store.DirState{Policies: st.(*store.Memory), Logins: f}
	}
	var sealer store.Sealer
	if s.opts.Broker {
		sealer = s.CredentialKey.BackupSealer()
	}
	var brk *broker.Broker
	if s.opts.Broker {
		var err error
		brk, err = broker.New(broker.Options{Logins: logins, Key: s.CredentialKey, TokenEndpoint: s.opts.TokenEndpoint, Now: now, Logger: s.opts.Logger})
		if err != nil {
			t.Fatalf("controlplanetest: %v", err)
		}
	}
	srv, err := controlplane.New(controlplane.Options{
		Broker:        brk,
		AgentCreds:    logins,
		Members:       logins,
		MemberBuckets: st,
		Durable:       durable,
		BackupSealer:  sealer,
		Admissions:    st,
		Policies:      st,
		Agents:        st,
		Roster:        roster,
		Quotas:        st,
		Usage:         st,
		MemberMetrics: s.opts.MemberMetrics,
		PolicyChanges: changes,
		AdminToken:    s.AdminToken,
		AgentToken:    s.AgentToken,
		TLS:           s.opts.TLS,
		Logger:        s.opts.Logger,
		Now:           now,
		Registerer:    s.opts.Registerer,
		EnableBench:   s.opts.EnableBench,
		ShutdownGrace: s.opts.ShutdownGrace,
		FleetTick:     s.opts.FleetTick,

		AgentCredChanges: credChanges,
	})
	if err != nil {
		t.Fatalf("controlplanetest: %v", err)
	}
	var lis net.Listener
	for range 50 { // the port of a stopped server is normally free at once
		lis, err = net.Listen("tcp", addr)
		if err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("controlplanetest: listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		stored := make(chan error, 1)
		go func() { stored <- st.Run(ctx) }()
		brokered := make(chan error, 1)
		go func() {
			if brk == nil {
				brokered <- nil
				return
			}
			brokered <- brk.Run(ctx)
		}()
		err := srv.Serve(ctx, lis)
		cancel()
		if berr := <-brokered; err == nil {
			err = berr
		}
		if serr := <-stored; err == nil {
			err = serr
		}
		closeStore()
		done <- err
	}()
	s.mu.Lock()
	s.Addr = lis.Addr().String()
	s.store, s.srv, s.cancel, s.done = st, srv, cancel, done
	s.mu.Unlock()
}

// servedStore is what the server serves from: the memory store, or Redis.
type servedStore interface {
	controlplane.Admitter
	controlplane.PolicyStore
	controlplane.AgentCounter
	controlplane.QuotaStore
	controlplane.MemberBuckets
	controlplane.UsageLedger
	Run(ctx context.Context) error
}

// Store returns the running server's store.
func (s *Server) Store() controlplane.PolicyStore {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.store
}

// Stop shuts the server down gracefully and waits for it; it is safe to
// call more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.cancel, s.done = nil, nil
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	if err := <-done; err != nil {
		s.t.Errorf("controlplanetest: serve: %v", err)
	}
}

// Kill stops the server at once, as a killed process would: every
// connection is closed without a goodbye, in-flight RPCs fail and agent
// streams break. It waits for the server to return and is safe to call
// more than once.
func (s *Server) Kill() {
	s.mu.Lock()
	srv, cancel, done := s.srv, s.cancel, s.done
	s.cancel, s.done = nil, nil
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	srv.Stop()
	cancel()
	if err := <-done; err != nil { // after a hard stop it says nothing about the test
		s.t.Logf("controlplanetest: serve after a kill: %v", err)
	}
}

// Restart stops the server and starts a new one on the same address and
// data directory (bucket levels start over; policies are reloaded).
func (s *Server) Restart() {
	s.t.Helper()
	addr := s.Addr
	s.Stop()
	s.start(addr)
	// The registering data planes reconnect, as real ones do.
	s.mu.Lock()
	registered := slices.Clone(s.registered)
	s.mu.Unlock()
	for _, keys := range registered {
		s.register(s.Dial(s.AgentToken, nil), keys)
	}
}

// Dial returns a client connection sending tok (none when tok is zero),
// closed when the test ends. tlsCfg nil means plaintext.
func (s *Server) Dial(tok bearer.Token, tlsCfg *tls.Config) *grpc.ClientConn {
	s.t.Helper()
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if !tok.IsZero() {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer.Credentials(tok)))
	}
	conn, err := grpc.NewClient(s.Addr, opts...)
	if err != nil {
		s.t.Fatalf("controlplanetest: dial: %v", err)
	}
	s.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Register registers keys as served by a data plane, the way a data
// plane does: an agent stream with the agent token whose hello lists
// them, held open until the test ends. It returns once the server has
// pushed the first policy (the agent is registered then). Admit refuses
// an account that no operator configured and no registered data plane
// serves.
func (s *Server) Register(keys ...string) {
	s.t.Helper()
	s.RegisterOver(s.Dial(s.AgentToken, nil), keys...)
}

// RegisterOver is Register over cc (for a server with TLS). Restart
// registers the keys again (over a plaintext connection).
func (s *Server) RegisterOver(cc *grpc.ClientConn, keys ...string) {
	s.t.Helper()
	s.mu.Lock()
	s.registered = append(s.registered, slices.Clone(keys))
	s.mu.Unlock()
	s.register(cc, keys)
}

func (s *Server) register(cc *grpc.ClientConn, keys []string) {
	s.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s.t.Cleanup(cancel)
	id := "controlplanetest-" + hex.EncodeToString(randBytes(4))
	stream, err := controlplanev1.NewAgentServiceClient(cc).Connect(ctx)
	if err != nil {
		s.t.Fatalf("controlplanetest: register: %v", err)
	}
	hello := &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Hello{Hello: &controlplanev1.AgentHello{
		AgentId: id, Host: "controlplanetest", Version: "test", CapabilityVersion: int32(controlplane.CapabilityVersion), Accounts: keys,
	}}}
	if err := stream.Send(hello); err != nil {
		s.t.Fatalf("controlplanetest: register: send hello: %v", err)
	}
	if _, err := stream.Recv(); err != nil {
		s.t.Fatalf("controlplanetest: register %d accounts: %v", len(keys), err)
	}
	// Drain the pushes so the server never blocks on this stream.
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}()
}
