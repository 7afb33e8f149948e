package pool

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/admission"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// With the real admission client and control plane: a request granted a
// wait for a new socket gets its reservation refunded when a head that it
// can continue frees up during the wait, and continues that head. The
// account's bucket ends where it was before the request asked.
func TestFreedHeadRefundsTheAdmittedSlot(t *testing.T) {
	clk := newFakeClock()
	oneAtATime := pacing.Policy{RatePerMinute: 60, Burst: 1, Budget: pacing.DefaultBudget()}
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, Defaults: &oneAtATime})
	srv.Register(account.Key("acct-1"))
	dial := func(tok bearer.Token) *grpc.ClientConn {
		conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(bearer.Credentials(tok)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	admin := controlplanev1.NewAdminServiceClient(dial(srv.AdminToken))
	waits := make(chan time.Duration, 1)
	adm, err := admission.New(admission.Config{
		Conn:    dial(srv.AgentToken),
		Timeout: 10 * time.Second, // a loaded machine must not turn an answer into a local decision
		Sleep: func(ctx context.Context, d time.Duration) error {
			waits <- d
			<-ctx.Done() // the granted wait, cut short by the freed head
			return ctx.Err()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adm.Close() })
	e := newEnv(t, func(c *Config) {
		c.Admitter = AdmitterFunc(func(ctx context.Context, acct string) error { return adm.Admit(ctx, account.Key(acct)) })
	})
	tokens := func() float64 {
		t.Helper()
		r, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: account.Key("acct-1")})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetAccount().GetTokens()
	}

	pt := part("sess-refund")
	e.turn(pt, items(user("u1")), "r1", items(assistant("a1"))) // the burst's one token
	in2 := items(user("u1"), assistant("a1"), user("u2"))
	busy, err := e.pool.Acquire(t.Context(), pt, in2) // continues: asks nothing
	if err != nil {
		t.Fatal(err)
	}
	in3 := cat(in2, items(assistant("a2"), user("u3")))
	got := make(chan *Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := e.pool.Acquire(t.Context(), pt, in3)
		got <- l
		errc <- err
	}()
	if d := <-waits; d != time.Second {
		t.Fatalf("granted wait %v, want 1s (60/min, the burst spent)", d)
	}
	if got := tokens(); got != -1 {
		t.Fatalf("tokens during the wait = %v, want -1 (the reservation is debited)", got)
	}
	busy.Complete("r2", items(assistant("a2")), Usage{})
	l, err := <-got, <-errc
	if err != nil {
		t.Fatalf("Acquire = %v, want the freed head", err)
	}
	defer l.Discard("done")
	if l.Decision != DecisionContinuation || l.PreviousResponseID != "r2" || e.dialer.dials() != 1 {
		t.Fatalf("lease %q after %q with %d dials, want a continuation after r2 and no new socket", l.Decision, l.PreviousResponseID, e.dialer.dials())
	}
	if got := tokens(); got != 0 {
		t.Errorf("tokens after the freed head = %v, want 0: the reservation refunded", got)
	}
	if s := adm.Stats(); s.Refunds != 1 || s.Cancels != 1 {
		t.Errorf("admission stats %+v, want one cancel, refunded", s)
	}
}
