package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/agent"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// BenchmarkSetRatePush measures one set-rate reaching two connected agents
// over loopback gRPC: from the SetRate call until both agents' OnPolicy
// ran with the new rate. ns/op is the fleet's push latency.
func BenchmarkSetRatePush(b *testing.B) {
	clk := newClock()
	srv := controlplanetest.Start(b, &controlplanetest.Options{Now: clk.Now, FleetTick: time.Hour})
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	conn := srv.Dial(srv.AgentToken, nil)
	got := make(chan int, 64) // generous: OnPolicy must never block
	for _, id := range []string{"b1-1-a", "b2-2-b"} {
		a, err := agent.New(agent.Config{
			Conn: conn, ID: id, Clock: clk.Now,
			Accounts: func() []string { return []string{keyA} },
			OnPolicy: func(_ string, p pacing.Policy, _ int) { got <- p.RatePerMinute },
		})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		b.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				b.Errorf("Run = %v, want nil once cancelled", err)
			}
		})
	}
	// Drain the pushes on connect and live-count changes.
	for drained := false; !drained; {
		select {
		case <-got:
		case <-time.After(200 * time.Millisecond):
			drained = true
		}
	}
	rate := int32(100)
	for b.Loop() {
		rate = 201 - rate // 101, 100, 101, ...: every call changes the rate
		if _, err := admin.SetRate(b.Context(), &controlplanev1.SetRateRequest{Key: keyA, RatePerMinute: rate}); err != nil {
			b.Fatal(err)
		}
		for n := 0; n < 2; {
			if r := <-got; r == int(rate) {
				n++
			}
		}
	}
}
