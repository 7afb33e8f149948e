package control_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// BenchmarkAdmitCentral is one Admit RPC to the real control plane over
// loopback (pacing off for the account, so every call admits at once).
func BenchmarkAdmitCentral(b *testing.B) {
	srv := controlplanetest.Start(b, nil)
	setRate(b, adminClient(srv), keyA, 0, 1)
	c, err := control.New(control.Config{Target: srv.Addr, Token: srv.AgentToken, AgentID: "bench-1-a"})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Admit(ctx, keyA); err != nil {
			b.Fatal(err)
		}
	}
	if m := c.Mode(); m != control.ModeCentral {
		b.Fatalf("mode %q, want central", m)
	}
}

// BenchmarkAdmitLocal is one decision of the local fallback bucket while
// the control plane is down: its dialer fails at no cost, so the benchmark
// measures the bucket path rather than failed dials. 600/minute and a
// clock that moves 100 ms per call, so every call takes the token that
// refilled and admits at once (about one call in twenty is also a failed
// probe, at the 2 s cap).
func BenchmarkAdmitLocal(b *testing.B) {
	clk := newFakeClock()
	c, err := control.New(control.Config{
		Target: "passthrough:///down",
		Dialer: func(context.Context, string) (net.Conn, error) { return nil, errors.New("down") },
		Token:  tok(b, "agent"), AgentID: "bench-1-a",
		Fallback: pacing.Policy{RatePerMinute: 600, Burst: 10, Budget: pacing.DefaultBudget()},
		Clock:    clk.Now,
		Sleep:    clk.Sleep,
		Rand:     func() float64 { return 0.5 },
	})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := b.Context()
	// Each outage's bucket starts empty: the first local decision is a
	// wait, after which a second refills the bucket.
	if err := c.Admit(ctx, keyA); err != nil {
		b.Fatal(err)
	}
	clk.Advance(time.Second)
	before := c.Stats().Local
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Admit(ctx, keyA); err != nil {
			b.Fatal(err)
		}
		clk.Advance(100 * time.Millisecond)
	}
	if s := c.Stats(); s.Local.Waits != before.Waits || s.Local.Refusals != 0 || s.Central != (control.Counts{}) {
		b.Fatalf("stats %+v, want only local admits after the first wait", s)
	}
}

// BenchmarkSetRatePush measures one set-rate reaching two connected agents
// over loopback gRPC: from the SetRate call until both clients applied the
// new rate. ns/op is the fleet's push latency.
func BenchmarkSetRatePush(b *testing.B) {
	clk := newFakeClock()
	srv := controlplanetest.Start(b, &controlplanetest.Options{Now: clk.Now, FleetTick: time.Hour})
	admin := adminClient(srv)
	got := make(chan int, 64) // generous: a push's log must never block
	for _, id := range []string{"b1-1-a", "b2-2-b"} {
		rec := newRecorder()
		rec.rates = got
		c, err := control.New(agentConfig(srv, clk, rec, id, keyA))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		b.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				b.Errorf("Run = %v, want nil once cancelled", err)
			}
			_ = c.Close()
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
