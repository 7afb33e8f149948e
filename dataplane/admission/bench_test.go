package admission_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/admission"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// BenchmarkAdmitCentral is one Admit RPC to the real control plane over
// loopback (pacing off for the account, so every call admits at once).
func BenchmarkAdmitCentral(b *testing.B) {
	srv := controlplanetest.Start(b, nil)
	admin := controlplanev1.NewAdminServiceClient(dial(b, srv.Addr, srv.AdminToken.Reveal()))
	setRate(b, admin, keyA, 0, 1)
	c, err := admission.New(admission.Config{Conn: dial(b, srv.Addr, srv.AgentToken.Reveal())})
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
	if m := c.Mode(); m != admission.ModeCentral {
		b.Fatalf("mode %q, want central", m)
	}
}

// downConn is a control plane that is always Unavailable at no cost, so
// the local benchmark measures the bucket path rather than failed dials.
type downConn struct{}

func (downConn) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	return status.Error(codes.Unavailable, "down")
}

func (downConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unavailable, "down")
}

// BenchmarkAdmitLocal is one decision of the local fallback bucket while
// the control plane is down: 600/minute and a clock that moves 100 ms per
// call, so every call takes the token that refilled and admits at once
// (about one call in a hundred is also a failed probe, at the 2 s cap).
func BenchmarkAdmitLocal(b *testing.B) {
	clk := newFakeClock()
	c, err := admission.New(admission.Config{
		Conn:     downConn{},
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
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Admit(ctx, keyA); err != nil {
			b.Fatal(err)
		}
		clk.Advance(100 * time.Millisecond)
	}
	if s := c.Stats(); s.Local.Waits != 0 || s.Local.Refusals != 0 || s.Central != (admission.Counts{}) {
		b.Fatalf("stats %+v, want only local admits", s)
	}
}
