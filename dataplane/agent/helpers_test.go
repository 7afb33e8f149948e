package agent_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/agent"
	"github.com/clodex/clodex/internal/account"
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

// clock is a fake clock safe for concurrent use.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// push is one OnPolicy call.
type push struct {
	key    string
	policy pacing.Policy
	live   int
}

// recorder collects OnPolicy calls.
type recorder struct {
	mu     sync.Mutex // guards the following fields
	pushes []push
	wake   chan struct{} // closed and replaced on every push
}

func newRecorder() *recorder { return &recorder{wake: make(chan struct{})} }

func (r *recorder) OnPolicy(key string, p pacing.Policy, live int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pushes = append(r.pushes, push{key, p, live})
	close(r.wake)
	r.wake = make(chan struct{})
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

// running is an agent whose Run is owned by the test.
type running struct {
	*agent.Agent
	rec  *recorder
	stop func()
}

func startServer(t *testing.T, clk *clock) *controlplanetest.Server {
	t.Helper()
	return controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: 10 * time.Millisecond})
}

func startAgent(t *testing.T, conn grpc.ClientConnInterface, clk *clock, id string, accounts ...string) *running {
	t.Helper()
	return startAgentHB(t, conn, clk, 0, id, accounts...)
}

// startAgentHB starts an agent heartbeating every hb (0: the default 5s).
func startAgentHB(t *testing.T, conn grpc.ClientConnInterface, clk *clock, hb time.Duration, id string, accounts ...string) *running {
	t.Helper()
	rec := newRecorder()
	a, err := agent.New(agent.Config{
		Conn:      conn,
		ID:        id,
		Host:      "host-" + id,
		Version:   "v1.2.3",
		Accounts:  func() []string { return accounts },
		OnPolicy:  rec.OnPolicy,
		Clock:     clk.Now,
		Heartbeat: hb,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
		})
	}
	t.Cleanup(stop)
	return &running{Agent: a, rec: rec, stop: stop}
}

func adminClient(srv *controlplanetest.Server) controlplanev1.AdminServiceClient {
	return controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
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
func stepClock(t *testing.T, clk *clock, admin controlplanev1.AdminServiceClient, d time.Duration, agents int) {
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
