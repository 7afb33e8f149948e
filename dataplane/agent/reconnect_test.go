package agent_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/agent"
)

// OnConnect runs once per stream opened: on the first connect and again
// after the control plane restarts.
func TestOnConnectOnEveryConnect(t *testing.T) {
	clk := newClock()
	srv := startServer(t, clk)
	rec := newRecorder()
	var connects atomic.Int64
	a, err := agent.New(agent.Config{
		Conn:      srv.Dial(srv.AgentToken, nil),
		ID:        "h1-1-a",
		Accounts:  func() []string { return []string{keyA} },
		OnPolicy:  rec.OnPolicy,
		OnConnect: func() { connects.Add(1) },
		Clock:     clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	}()

	rec.waitFor(t, "on connect", keyA, func(push) bool { return true })
	if got := connects.Load(); got != 1 {
		t.Fatalf("OnConnect calls after the first connect = %d, want 1", got)
	}
	first := rec.count()
	srv.Stop()
	srv.Restart()
	eventually(t, "a push after the restart", func() bool { return rec.count() > first })
	if got := connects.Load(); got != 2 {
		t.Errorf("OnConnect calls after the restart = %d, want 2", got)
	}
}

// When agents leave, the control plane pushes the lower count at once, but
// LiveAgents keeps the higher one for the 15 s liveness window.
func TestLiveAgentsHoldsTheHigherCountForTheWindow(t *testing.T) {
	clk := newClock()
	srv := startServer(t, clk)
	conn := srv.Dial(srv.AgentToken, nil)
	a1 := startAgent(t, conn, clk, "h1-1-a", keyA)
	a2 := startAgent(t, conn, clk, "h2-2-b", keyA)
	a3 := startAgent(t, conn, clk, "h3-3-c", keyA)
	a1.rec.waitFor(t, "with live 3", keyA, func(p push) bool { return p.live == 3 })
	if got := a1.LiveAgents(keyA); got != 3 {
		t.Fatalf("LiveAgents = %d, want 3", got)
	}

	a2.stop()
	a3.stop()
	a1.rec.waitFor(t, "with live 1", keyA, func(p push) bool { return p.live == 1 })
	if got := a1.LiveAgents(keyA); got != 3 {
		t.Errorf("LiveAgents right after the drop = %d, want 3", got)
	}
	clk.Advance(agent.LiveWindow - time.Millisecond)
	if got := a1.LiveAgents(keyA); got != 3 {
		t.Errorf("LiveAgents 14.999s after the drop = %d, want 3", got)
	}
	clk.Advance(time.Millisecond)
	if got := a1.LiveAgents(keyA); got != 1 {
		t.Errorf("LiveAgents 15s after the drop = %d, want 1", got)
	}
}
