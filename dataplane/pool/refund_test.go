package pool_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/dataplane/upstream/upstreamtest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// With the real admission client and control plane: a request granted a
// wait for a new socket gets its reservation refunded when a head that it
// can continue frees up during the wait, and continues that head. The
// account's bucket ends where it was before the request asked.
func TestFreedHeadRefundsTheAdmittedSlot(t *testing.T) {
	clk := &refundClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
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
	adm, err := control.New(control.Config{
		Target: srv.Addr, Token: srv.AgentToken, AgentID: "refund-1-1-aa", Accounts: []string{account.Key("acct-1")},
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
	up := upstreamtest.NewServer(t)
	p, err := pool.New(pool.Config{
		Upstream: upstream.DialOptions{URL: up.URL, HTTPClient: up.Client()},
		Credentials: pool.CredentialsFunc(func(context.Context, string) (codexauth.Credential, error) {
			return codexauth.Credential{AccessToken: "tok-test", AccountID: "acct-1"}, nil
		}),
		Admitter: pool.AdmitterFunc(func(ctx context.Context, acct string) error { return adm.Admit(ctx, account.Key(acct)) }),
		Clock:    clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	tokens := func() float64 {
		t.Helper()
		r, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: account.Key("acct-1")})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetAccount().GetTokens()
	}

	pt := pool.Partition{Account: "acct-1", Model: "gpt-5-codex", Effort: "high", PromptCacheKey: "sess-refund"}
	first, err := p.Acquire(t.Context(), pt, [][]byte{item("u1")}) // the burst's one token
	if err != nil {
		t.Fatal(err)
	}
	first.Complete("r1", [][]byte{item("a1")}, pool.Usage{})
	in2 := [][]byte{item("u1"), item("a1"), item("u2")}
	busy, err := p.Acquire(t.Context(), pt, in2) // continues: asks nothing
	if err != nil {
		t.Fatal(err)
	}
	in3 := append(append([][]byte{}, in2...), item("a2"), item("u3"))
	got := make(chan *pool.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := p.Acquire(t.Context(), pt, in3)
		got <- l
		errc <- err
	}()
	if d := <-waits; d != time.Second {
		t.Fatalf("granted wait %v, want 1s (60/min, the burst spent)", d)
	}
	if got := tokens(); got != -1 {
		t.Fatalf("tokens during the wait = %v, want -1 (the reservation is debited)", got)
	}
	busy.Complete("r2", [][]byte{item("a2")}, pool.Usage{})
	l, err := <-got, <-errc
	if err != nil {
		t.Fatalf("Acquire = %v, want the freed head", err)
	}
	defer l.Discard("done")
	if l.Decision != pool.DecisionContinuation || l.PreviousResponseID != "r2" || up.Upgrades() != 1 {
		t.Fatalf("lease %q after %q with %d dials, want a continuation after r2 and no new socket", l.Decision, l.PreviousResponseID, up.Upgrades())
	}
	if got := tokens(); got != 0 {
		t.Errorf("tokens after the freed head = %v, want 0: the reservation refunded", got)
	}
	if s := adm.Stats(); s.Refunds != 1 || s.Cancels != 1 {
		t.Errorf("admission stats %+v, want one cancel, refunded", s)
	}
}

// item is a canonical user message item with text.
func item(text string) []byte {
	return []byte(`{"content":[{"text":"` + text + `","type":"input_text"}],"role":"user","type":"message"}`)
}

// refundClock is a manually advanced clock.
type refundClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *refundClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}
