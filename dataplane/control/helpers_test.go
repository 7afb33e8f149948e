package control_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"
	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

var (
	keyA = account.Key("chatgpt-account-a")
	keyB = account.Key("chatgpt-account-b")
)

// waitTimeout is a generous bound on waiting for an event that normally
// takes milliseconds; it fails a stuck test rather than timing anything.
const waitTimeout = 20 * time.Second

// fakeClock is the test's time: Now reads it, Advance moves it. Sleep
// records every requested delay; it returns at once without moving the
// clock (arrivals are simultaneous unless the test advances time), or, when
// blocking is on, reports the delay on Blocked and waits for ctx to end.
type fakeClock struct {
	Blocked chan time.Duration // receives the delay of each blocking Sleep

	mu     sync.Mutex // guards the following fields
	now    time.Time
	sleeps []time.Duration
	block  bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{
		Blocked: make(chan time.Duration),
		now:     time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
	}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *fakeClock) SetBlocking(b bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.block = b
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	block := c.block
	c.mu.Unlock()
	if !block {
		return nil
	}
	select {
	case c.Blocked <- d:
	case <-ctx.Done():
		return ctx.Err()
	}
	<-ctx.Done()
	return ctx.Err()
}

// TakeSleeps returns the delays slept since the last call.
func (c *fakeClock) TakeSleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sleeps
	c.sleeps = nil
	return s
}

// noticeLog collects Notify messages.
type noticeLog struct {
	mu   sync.Mutex // guards msgs
	msgs []string
}

func (n *noticeLog) Notify(msg string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.msgs = append(n.msgs, msg)
}

func (n *noticeLog) Msgs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.msgs...)
}

// tok is s as an agent token.
func tok(t testing.TB, s string) bearer.Token {
	t.Helper()
	tk, err := bearer.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// waitReady blocks until c's connection is READY (state changes are
// events, not polls); the timeout only keeps a broken test from hanging.
func waitReady(t testing.TB, c *control.Client) {
	t.Helper()
	conn := c.ClientConn()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return
		}
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("connection to %s not ready: %v", conn.Target(), s)
		}
	}
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// newClient builds a client with the fake clock and notice log, zero
// jitter (Rand 0.5), an agent id unless cfg has one, and cfg's other
// fields. It does not run it: admission needs no Run.
func newClient(t testing.TB, cfg control.Config, clk *fakeClock, notes *noticeLog) *control.Client {
	t.Helper()
	cfg.Clock = clk.Now
	cfg.Sleep = clk.Sleep
	cfg.Notify = notes.Notify
	cfg.Rand = func() float64 { return 0.5 }
	if cfg.AgentID == "" {
		cfg.AgentID = "test-1-abcd"
	}
	c, err := control.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func setRate(t testing.TB, admin controlplanev1.AdminServiceClient, key string, rate, burst int32) {
	t.Helper()
	if _, err := admin.SetRate(context.Background(), &controlplanev1.SetRateRequest{Key: key, RatePerMinute: rate, Burst: proto.Int32(burst)}); err != nil {
		t.Fatalf("SetRate(%d, burst %d): %v", rate, burst, err)
	}
}

func tokens(t testing.TB, admin controlplanev1.AdminServiceClient, key string) float64 {
	t.Helper()
	resp, err := admin.GetAccount(context.Background(), &controlplanev1.GetAccountRequest{Key: key})
	if err != nil {
		t.Fatalf("GetAccount: %v", err)
	}
	return resp.GetAccount().GetTokens()
}

func adminClient(srv *controlplanetest.Server) controlplanev1.AdminServiceClient {
	return controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
}

// push is one policy push, as the client logs it.
type push struct {
	key    string
	policy pacing.Policy
	live   int
}

// recorder is a slog.Handler that collects the pushes a client logs
// ("policy from the control plane") and counts its stream's connects.
type recorder struct {
	mu       sync.Mutex // guards the following fields
	pushes   []push
	connects int
	wake     chan struct{} // closed and replaced on every push and connect
	rates    chan<- int    // when set, receives every push's rate
	lines    []string      // every record: its message and attributes
}

// text returns every record logged so far, one a line.
func (r *recorder) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}

func newRecorder() *recorder { return &recorder{wake: make(chan struct{})} }

func (r *recorder) logger() *slog.Logger { return slog.New(r) }

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }

func (r *recorder) WithGroup(string) slog.Handler { return r }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	line := rec.Message
	rec.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	r.lines = append(r.lines, line)
	switch rec.Message {
	case "policy from the control plane":
		p := pushOf(rec)
		r.pushes = append(r.pushes, p)
		if r.rates != nil {
			r.rates <- p.policy.RatePerMinute
		}
	case "agent stream connected":
		r.connects++
	default:
		return nil
	}
	close(r.wake)
	r.wake = make(chan struct{})
	return nil
}

// pushOf reads a push from its log record: the account, the rate, burst
// and budget to pace at (the wait bound derived as the client derives it)
// and the live agents.
func pushOf(rec slog.Record) push {
	var p push
	var idle, total time.Duration
	var retries int
	rec.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "account":
			p.key = a.Value.String()
		case "rate_per_minute":
			p.policy.RatePerMinute = int(a.Value.Int64())
		case "burst":
			p.policy.Burst = int(a.Value.Int64())
		case "live_agents":
			p.live = int(a.Value.Int64())
		case "max_retries":
			retries = int(a.Value.Int64())
		case "idle_timeout":
			idle = a.Value.Duration()
		case "total_timeout":
			total = a.Value.Duration()
		}
		return true
	})
	p.policy.Budget, _ = pacing.ResolveBudget(pacing.BudgetInput{IdleTimeout: &idle, TotalTimeout: &total, MaxRetries: &retries})
	return p
}

// waitFor waits until the latest push for key satisfies ok and returns it.
func (r *recorder) waitFor(t *testing.T, what, key string, ok func(push) bool) push {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		var last *push
		for i := range r.pushes {
			if r.pushes[i].key == key {
				last = &r.pushes[i]
			}
		}
		wake := r.wake
		if last != nil && ok(*last) {
			p := *last
			r.mu.Unlock()
			return p
		}
		r.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("no push for %s %s; pushes: %+v", key, what, r.pushes)
		}
	}
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pushes)
}

func (r *recorder) connected() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connects
}

// running is a client whose Run is owned by the test.
type running struct {
	*control.Client
	rec  *recorder
	stop func()
}

func startServer(t *testing.T, clk *fakeClock) *controlplanetest.Server {
	t.Helper()
	return controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: 10 * time.Millisecond})
}

// agentConfig is the configuration of a client serving accounts on srv
// as agent id.
func agentConfig(srv *controlplanetest.Server, clk *fakeClock, rec *recorder, id string, accounts ...string) control.Config {
	return control.Config{
		Target:   srv.Addr,
		Token:    srv.AgentToken,
		AgentID:  id,
		Host:     "host-" + id,
		Version:  "v1.2.3",
		Accounts: accounts,
		Clock:    clk.Now,
		Logger:   rec.logger(),
	}
}

func startAgent(t *testing.T, srv *controlplanetest.Server, clk *fakeClock, id string, accounts ...string) *running {
	t.Helper()
	return startAgentHB(t, srv, clk, 0, id, accounts...)
}

// startAgentHB starts a client heartbeating every hb (0: the default 5s).
func startAgentHB(t *testing.T, srv *controlplanetest.Server, clk *fakeClock, hb time.Duration, id string, accounts ...string) *running {
	t.Helper()
	rec := newRecorder()
	cfg := agentConfig(srv, clk, rec, id, accounts...)
	cfg.Heartbeat = hb
	return run(t, cfg, rec)
}

// run builds a client from cfg and runs it (runClient).
func run(t *testing.T, cfg control.Config, rec *recorder) *running {
	t.Helper()
	c, err := control.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return runClient(t, c, rec)
}

// runClient runs c until stop (or the test's end), then closes it.
func runClient(t *testing.T, c *control.Client, rec *recorder) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
			_ = c.Close()
		})
	}
	t.Cleanup(stop)
	return &running{Client: c, rec: rec, stop: stop}
}

// eventually waits until cond holds, checking every 5ms.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stepClock advances clk by d (< 15s) and waits until every registered
// agent has heartbeated at the new time, so none expires.
func stepClock(t *testing.T, clk *fakeClock, admin controlplanev1.AdminServiceClient, d time.Duration, agents int) {
	t.Helper()
	clk.Advance(d)
	eventually(t, "heartbeats at the new time", func() bool {
		resp, err := admin.ListAgents(t.Context(), &controlplanev1.ListAgentsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, a := range resp.GetAgents() {
			if a.GetLive() && a.GetLastSeenUnixMs() == clk.Now().UnixMilli() {
				n++
			}
		}
		return n == agents
	})
}
