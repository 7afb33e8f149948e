package admission_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/dataplane/admission"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

var (
	keyA = account.Key("chatgpt-account-a")
	keyB = account.Key("chatgpt-account-b")
)

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

// tokenCreds sends a bearer token over plaintext loopback.
type tokenCreds string

func (t tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (tokenCreds) RequireTransportSecurity() bool { return false }

// dial connects to addr with token and a short reconnect backoff, so a
// restarted server is reachable again within milliseconds of real time.
func dial(t testing.TB, addr, token string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(tokenCreds(token)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, opts...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// waitReady blocks until conn is READY (state changes are events, not
// polls); the timeout only keeps a broken test from hanging.
func waitReady(t testing.TB, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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
// jitter (Rand 0.5), and cfg's other fields.
func newClient(t testing.TB, cfg admission.Config, clk *fakeClock, notes *noticeLog) *admission.Client {
	t.Helper()
	cfg.Clock = clk.Now
	cfg.Sleep = clk.Sleep
	cfg.Notify = notes.Notify
	cfg.Rand = func() float64 { return 0.5 }
	c, err := admission.New(cfg)
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
