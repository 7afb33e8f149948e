package controlplane_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// set-budget with only an idle timeout lowers the retries to the largest
// whose ladder fits (3 at 30 s: 2+4+8 = 14 s; 4 would take 30 s), and an
// explicit retry count that does not fit is refused naming that number.
func TestSetBudgetDerivesRetries(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	ctx := t.Context()
	resp, err := admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, IdleTimeoutMs: proto.Int64(30000)})
	if err != nil {
		t.Fatalf("SetBudget(idle 30s) = %v, want the retries derived", err)
	}
	// bound = min(15000, floor((30000 - 14000) / 2 / 4)) = 2000
	if a := resp.GetAccount(); a.GetMaxRetries() != 3 || a.GetIdleTimeoutMs() != 30000 || a.GetWaitBoundMs() != 2000 {
		t.Errorf("SetBudget(idle 30s) = %v, want max_retries 3, wait bound 2000ms", a)
	}
	_, err = admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, IdleTimeoutMs: proto.Int64(30000), MaxRetries: proto.Int32(4)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "max_retries 4 does not fit the 30000ms idle timeout: its backoff ladder takes 30000ms; the largest that fits is 3") {
		t.Errorf("SetBudget(idle 30s, retries 4) = %v, want InvalidArgument naming 3", err)
	}
	// Retries that still fit are kept.
	resp, err = admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, MaxRetries: proto.Int32(1)})
	if err != nil || resp.GetAccount().GetMaxRetries() != 1 {
		t.Fatalf("SetBudget(retries 1) = %v, %v", resp, err)
	}
	resp, err = admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, IdleTimeoutMs: proto.Int64(120000)})
	if err != nil || resp.GetAccount().GetMaxRetries() != 1 {
		t.Errorf("SetBudget(idle 120s) with 1 retry = %v, %v; want 1 kept", resp, err)
	}
	// A total timeout below the idle timeout is still refused.
	_, err = admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, TotalTimeoutMs: proto.Int64(60000)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "is inconsistent and is not clamped") {
		t.Errorf("SetBudget(total below idle) = %v, want InvalidArgument", err)
	}
}

func TestReportGrants(t *testing.T) {
	clk := newClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(key, account.Key("chatgpt-account-2"))
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	ctx := t.Context()
	other := account.Key("chatgpt-account-2")
	req := &controlplanev1.ReportGrantsRequest{ReportId: "agent-1-7", AgentId: "agent-1", Grants: []*controlplanev1.LocalGrants{
		{Account: key, Count: 20}, {Account: other, Count: 3},
	}}
	resp, err := admission.ReportGrants(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// Defaults (60/min, burst 10, bound 4833ms): 10 now and 4 waits are
	// debited; the 15th would be refused, so the rest are not.
	d := resp.GetDebits()
	if len(d) != 2 || d[0].GetDebited() != 14 || d[0].GetTokens() != -4 || d[1].GetDebited() != 3 || d[1].GetTokens() != 7 || d[0].GetDuplicate() {
		t.Fatalf("ReportGrants = %v, want 14 debited (tokens -4) and 3 debited (tokens 7)", resp)
	}
	r, err := admission.Admit(ctx, &controlplanev1.AdmitRequest{Account: key})
	if err != nil || r.GetDecision() != controlplanev1.Decision_DECISION_REFUSE {
		t.Errorf("Admit after the hand-over = %v, %v; want a refusal", r, err)
	}
	resp, err = admission.ReportGrants(ctx, req)
	if err != nil || !resp.GetDebits()[0].GetDuplicate() || resp.GetDebits()[0].GetDebited() != 0 || !resp.GetDebits()[1].GetDuplicate() {
		t.Errorf("the same report again = %v, %v; want duplicates, nothing debited", resp, err)
	}
	bad := []struct {
		name string
		req  *controlplanev1.ReportGrantsRequest
		want string
	}{
		{"no report id", &controlplanev1.ReportGrantsRequest{Grants: []*controlplanev1.LocalGrants{{Account: key, Count: 1}}}, "report_id is 0 bytes"},
		{"space in report id", &controlplanev1.ReportGrantsRequest{ReportId: "a b", Grants: []*controlplanev1.LocalGrants{{Account: key, Count: 1}}}, "report_id has a byte 0x20"},
		{"no grants", &controlplanev1.ReportGrantsRequest{ReportId: "r"}, "grants lists 0 accounts; allowed 1..200"},
		{"zero count", &controlplanev1.ReportGrantsRequest{ReportId: "r", Grants: []*controlplanev1.LocalGrants{{Account: key}}}, "grants[0].count 0 is out of range; allowed 1..100000"},
		{"bad account", &controlplanev1.ReportGrantsRequest{ReportId: "r", Grants: []*controlplanev1.LocalGrants{{Account: "a b", Count: 1}}}, "grants[0].account"},
		{"account twice", &controlplanev1.ReportGrantsRequest{ReportId: "r", Grants: []*controlplanev1.LocalGrants{{Account: key, Count: 1}, {Account: key, Count: 1}}}, "is listed twice"},
	}
	for _, tt := range bad {
		_, err := admission.ReportGrants(ctx, tt.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: ReportGrants = %v, want InvalidArgument containing %q", tt.name, err, tt.want)
		}
	}
	// Agents may report; the call needs a token.
	_, err = controlplanev1.NewAdmissionServiceClient(srv.Dial(mustToken(t, "wrong"), nil)).ReportGrants(ctx, req)
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("ReportGrants with a wrong token = %v, want Unauthenticated", err)
	}
}

func TestStoreInfoOnAdminReads(t *testing.T) {
	rs := redistest.Start(t)
	for _, tt := range []struct {
		opts *controlplanetest.Options
		kind string
	}{
		{nil, "memory"},
		{&controlplanetest.Options{RedisURL: rs.URL, Replica: "cp-a"}, "redis"},
	} {
		srv := controlplanetest.Start(t, tt.opts)
		srv.Register(key)
		admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
		if _, err := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil)).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key}); err != nil {
			t.Fatal(err)
		}
		g, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: key})
		if err != nil {
			t.Fatal(err)
		}
		l, err := admin.ListAccounts(t.Context(), &controlplanev1.ListAccountsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range []*controlplanev1.StoreInfo{g.GetStore(), l.GetStore()} {
			if st.GetKind() != tt.kind || st.GetDegraded() || st.GetReplicas() != 1 {
				t.Errorf("store = %v, want kind %s, not degraded, 1 replica", st, tt.kind)
			}
			if tt.kind == "redis" && (st.GetReplica() != "cp-a" || st.GetAddress() != rs.URL) {
				t.Errorf("store = %v, want replica cp-a at %s", st, rs.URL)
			}
		}
	}
}

// agentStream connects an agent serving key to srv and returns a channel
// of its policy pushes.
func agentStream(t *testing.T, srv *controlplanetest.Server, id string) <-chan *controlplanev1.PolicyPush {
	t.Helper()
	stream := connect(t, srv, hello(id, key))
	pushes := make(chan *controlplanev1.PolicyPush, 64)
	go func() {
		defer close(pushes)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if p := m.GetPolicy(); p != nil {
				pushes <- p
			}
		}
	}()
	return pushes
}

// waitPush waits for a push satisfying ok; bound only guards a hung test.
func waitPush(t *testing.T, pushes <-chan *controlplanev1.PolicyPush, ok func(*controlplanev1.PolicyPush) bool) *controlplanev1.PolicyPush {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case p, open := <-pushes:
			if !open {
				t.Fatal("agent stream ended before the expected push")
			}
			if ok(p) {
				return p
			}
		case <-timeout:
			t.Fatal("no matching policy push within 30s")
		}
	}
}

// Two replicas over one Redis, an agent on each: a rate set through one
// replica reaches the agent on the other by the replicas' notification
// (their periodic version check is an hour away here), and both replicas
// decide on one bucket.
func TestReplicasSharePoliciesAndBuckets(t *testing.T) {
	rs := redistest.Start(t)
	clk := newClock()
	base := controlplanetest.Options{Now: clk.Now, RedisURL: rs.URL, RedisPrefix: "share:", RedisTick: time.Hour, RedisTimeout: 5 * time.Second}
	optsA, optsB := base, base
	optsA.Replica, optsB.Replica = "cp-a", "cp-b"
	a := controlplanetest.Start(t, &optsA)
	b := controlplanetest.Start(t, &optsB)
	waitSubscribers(t, rs, "share:policy", 2)

	pushesA := agentStream(t, a, "agent-a")
	pushesB := agentStream(t, b, "agent-b")
	waitPush(t, pushesA, func(p *controlplanev1.PolicyPush) bool { return p.GetRatePerMinute() == 60 })
	waitPush(t, pushesB, func(p *controlplanev1.PolicyPush) bool { return p.GetRatePerMinute() == 60 })

	adminA := controlplanev1.NewAdminServiceClient(a.Dial(a.AdminToken, nil))
	set := time.Now()
	if _, err := adminA.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 30, Burst: proto.Int32(5)}); err != nil {
		t.Fatal(err)
	}
	p := waitPush(t, pushesB, func(p *controlplanev1.PolicyPush) bool { return p.GetRatePerMinute() == 30 })
	t.Logf("set-rate through replica A reached the agent on replica B after %v", time.Since(set).Round(time.Millisecond))
	if p.GetBurst() != 5 || p.GetPolicyVersion() != 1 {
		t.Errorf("push on replica B = %v, want burst 5, version 1", p)
	}
	waitPush(t, pushesA, func(p *controlplanev1.PolicyPush) bool { return p.GetRatePerMinute() == 30 })

	// One bucket: 5 admitted across both replicas, then waits of 2 s, 4 s.
	admA := controlplanev1.NewAdmissionServiceClient(a.Dial(a.AgentToken, nil))
	admB := controlplanev1.NewAdmissionServiceClient(b.Dial(b.AgentToken, nil))
	var got []int64
	var last *controlplanev1.AdmitResponse
	for i := range 7 {
		c := admA
		if i%2 == 1 {
			c = admB
		}
		r, err := c.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.GetWaitMs())
		if r.GetDecision() == controlplanev1.Decision_DECISION_REFUSE {
			t.Fatalf("admit %d refused: %v", i+1, r)
		}
		last = r
	}
	if want := []int64{0, 0, 0, 0, 0, 2000, 4000}; !equalInts(got, want) {
		t.Errorf("waits across replicas = %v, want %v", got, want)
	}
	// The next would wait 6 s, past the 4833 ms bound: refused on either.
	if r, err := admB.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key}); err != nil || r.GetDecision() != controlplanev1.Decision_DECISION_REFUSE {
		t.Fatalf("8th admit = %v, %v; want a refusal", r, err)
	}
	// The reservation made on A is cancelled on B, once; its slot is free.
	for i, want := range []bool{true, false} {
		c, err := admB.Cancel(t.Context(), &controlplanev1.CancelRequest{Account: key, ReservationId: last.GetReservationId()})
		if err != nil || c.GetRefunded() != want {
			t.Errorf("Cancel %d on the other replica = %v, %v; want refunded %v", i+1, c, err, want)
		}
	}
	if r, err := admB.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key}); err != nil || r.GetWaitMs() != 4000 {
		t.Errorf("admit after the cancellation = %v, %v; want the freed 4000ms slot", r, err)
	}
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// waitSubscribers waits until n clients subscribe to channel.
func waitSubscribers(t *testing.T, rs *redistest.Server, channel string, n int) {
	t.Helper()
	for range 3000 {
		got, err := rs.NumSub(t.Context(), channel)
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("fewer than %d subscribers to %s after 30s", n, channel)
}

// Redis killed mid-load: no Admit fails or waits past the Redis deadline
// (plus scheduling slack), the replica says so once and admits from its
// share, and when Redis returns central admission resumes and the local
// grants are handed over.
func TestRedisKilledMidLoad(t *testing.T) {
	rs := redistest.Start(t)
	var logs syncBuffer
	const deadline = 100 * time.Millisecond
	srv := controlplanetest.Start(t, &controlplanetest.Options{
		RedisURL: rs.URL, RedisTimeout: deadline, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		FleetTick: 20 * time.Millisecond, // the store's health follows within a tick
	})
	var loadKeys []string
	for w := range 8 {
		loadKeys = append(loadKeys, account.Key("load-"+string(rune('a'+w))))
	}
	srv.Register(loadKeys...)
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	health := healthpb.NewHealthClient(srv.Dial(srv.AgentToken, nil))
	ctx, stop := context.WithCancel(t.Context())
	var (
		mu      sync.Mutex
		slowest time.Duration
		calls   int
		failed  []error
		wg      sync.WaitGroup
	)
	for w := range 8 {
		wg.Go(func() {
			k := account.Key("load-" + string(rune('a'+w)))
			for ctx.Err() == nil {
				start := time.Now()
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := admission.Admit(cctx, &controlplanev1.AdmitRequest{Account: k})
				cancel()
				el := time.Since(start)
				mu.Lock()
				calls++
				slowest = max(slowest, el)
				if err != nil {
					failed = append(failed, err)
				}
				mu.Unlock()
			}
		})
	}
	waitCalls := func(n int) {
		for start := calls0(&mu, &calls); calls0(&mu, &calls) < start+n; {
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitCalls(200)
	rs.Kill()
	killed := time.Now()
	waitHealth(t, health, healthpb.HealthCheckResponse_NOT_SERVING)
	waitCalls(500) // admissions continue from the local share
	rs.Restart()
	back := time.Now()
	waitHealth(t, health, healthpb.HealthCheckResponse_SERVING)
	resumed := time.Since(back)
	waitCalls(200)
	stop()
	wg.Wait()

	t.Logf("%d Admits; slowest %v; degraded %v after the kill; central again %v after Redis returned",
		calls, slowest.Round(time.Millisecond), back.Sub(killed).Round(time.Millisecond), resumed.Round(time.Millisecond))
	if len(failed) > 0 {
		t.Errorf("%d Admits failed while Redis was killed and restarted, first: %v", len(failed), failed[0])
	}
	// The deadline bounds every Redis call; a second of slack absorbs a
	// loaded machine's scheduling, far below a caller's own deadline.
	if slowest > deadline+time.Second {
		t.Errorf("slowest Admit took %v; want within the %v Redis deadline (plus 1s of scheduling slack)", slowest, deadline)
	}
	out := logs.String()
	if n := strings.Count(out, "redis unreachable"); n != 1 {
		t.Errorf("the outage was logged %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "redis answers again; central admission resumed") {
		t.Errorf("no resumption logged:\n%s", out)
	}
	// The restarted Redis is empty; the grants made from the share during
	// the outage were handed over, so the accounts are not full.
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	list, err := admin.ListAccounts(t.Context(), &controlplanev1.ListAccountsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetAccounts()) == 0 || list.GetStore().GetDegraded() {
		t.Fatalf("after the outage Redis knows %d accounts (store %v); want the handed-over accounts", len(list.GetAccounts()), list.GetStore())
	}
}

func calls0(mu *sync.Mutex, n *int) int {
	mu.Lock()
	defer mu.Unlock()
	return *n
}

func waitHealth(t *testing.T, h healthpb.HealthClient, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	for range 3000 {
		r, err := h.Check(t.Context(), &healthpb.HealthCheckRequest{Service: controlplane.StoreHealthService})
		if err == nil && r.GetStatus() == want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("store health never became %v within 30s", want)
}

// Accuracy across replicas: two replicas over one Redis, two load
// generators on each, all hammering one account (30/min, burst 5) over
// gRPC for 60 s of an injected clock shared by both replicas. Every 50 ms
// each generator asks once, the four at once. At most rate x time + burst
// admissions may dial within the 60 s (an admission dials at its arrival
// plus its wait), plus 1 %: 35.
func TestAccuracyAcrossReplicas(t *testing.T) {
	rs := redistest.Start(t)
	clk := newClock()
	start := clk.Now()
	// The central path is under test, not the breaker: a deadline no
	// loaded test machine reaches keeps every decision in Redis (a replica
	// answering from its share would be a different claim).
	var logs syncBuffer
	base := controlplanetest.Options{Now: clk.Now, RedisURL: rs.URL, RedisPrefix: "accuracy:", RedisTick: time.Hour,
		RedisTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	a := controlplanetest.Start(t, &base)
	b := controlplanetest.Start(t, &base)
	if _, err := controlplanev1.NewAdminServiceClient(a.Dial(a.AdminToken, nil)).SetRate(t.Context(),
		&controlplanev1.SetRateRequest{Key: key, RatePerMinute: 30, Burst: proto.Int32(5)}); err != nil {
		t.Fatal(err)
	}
	var gens []controlplanev1.AdmissionServiceClient
	for _, srv := range []*controlplanetest.Server{a, a, b, b} {
		gens = append(gens, controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil)))
	}
	const (
		step   = 50 * time.Millisecond
		window = 60 * time.Second
	)
	var dialed, refused, asked int
	var mu sync.Mutex
	for at := time.Duration(0); at < window; at += step {
		var wg sync.WaitGroup
		for _, g := range gens {
			wg.Go(func() {
				r, err := g.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key})
				mu.Lock()
				defer mu.Unlock()
				asked++
				switch {
				case err != nil:
					t.Errorf("Admit at +%v: %v", at, err)
				case r.GetDecision() == controlplanev1.Decision_DECISION_REFUSE:
					refused++
				case at+time.Duration(r.GetWaitMs())*time.Millisecond <= window:
					dialed++
				}
			})
		}
		wg.Wait()
		clk.Advance(step)
	}
	limit := (30*int(window/time.Minute) + 5) * 101 / 100
	t.Logf("%d asked over %v from %v, %d dialed within the window, %d refused; limit %d", asked, window, start.Format(time.TimeOnly), dialed, refused, limit)
	if dialed > limit {
		t.Errorf("%d admissions dialed within %v at 30/min burst 5 across 2 replicas; want at most %d", dialed, window, limit)
	}
	if dialed < 30 {
		t.Errorf("%d admissions dialed within %v; want about 35 (the bucket admits at its rate)", dialed, window)
	}
	if strings.Contains(logs.String(), "redis unreachable") {
		t.Errorf("a replica left Redis during the run:\n%s", logs.String())
	}
}

// The live count pushed to an agent counts the agents of every replica:
// one agent on replica A and two on B serve the account, so A's agent is
// told 3 (its local share is a third), not 1. When B's agents leave, A's
// agent is told 1 within a fleet tick.
func TestLiveAgentsCountEveryReplica(t *testing.T) {
	rs := redistest.Start(t)
	clk := newClock()
	base := controlplanetest.Options{Now: clk.Now, RedisURL: rs.URL, RedisPrefix: "live:", RedisTimeout: 5 * time.Second,
		FleetTick: 20 * time.Millisecond}
	optsA, optsB := base, base
	optsA.Replica, optsB.Replica = "cp-a", "cp-b"
	a := controlplanetest.Start(t, &optsA)
	optsB.Tokens = a
	b := controlplanetest.Start(t, &optsB)

	pushesA := agentStream(t, a, "agent-a1")
	waitPush(t, pushesA, func(p *controlplanev1.PolicyPush) bool { return p.GetLiveAgents() == 1 })
	pushesB1 := agentStream(t, b, "agent-b1")
	pushesB2 := agentStream(t, b, "agent-b2")
	waitPush(t, pushesA, func(p *controlplanev1.PolicyPush) bool { return p.GetLiveAgents() == 3 })
	waitPush(t, pushesB1, func(p *controlplanev1.PolicyPush) bool { return p.GetLiveAgents() == 3 })
	waitPush(t, pushesB2, func(p *controlplanev1.PolicyPush) bool { return p.GetLiveAgents() == 3 })

	b.Stop() // B's streams end: it deregisters its agents
	waitPush(t, pushesA, func(p *controlplanev1.PolicyPush) bool { return p.GetLiveAgents() == 1 })
}

// Two replicas over one Redis, an agent on each: either replica lists
// both (clodexctl agents shows the fleet whichever replica the Service
// picked), and an agent that says goodbye leaves both lists.
func TestAnyReplicaListsTheFleet(t *testing.T) {
	rs := redistest.Start(t)
	base := controlplanetest.Options{RedisURL: rs.URL, RedisPrefix: "roster:", RedisTimeout: 5 * time.Second}
	optsA, optsB := base, base
	optsA.Replica, optsB.Replica = "cp-a", "cp-b"
	a := controlplanetest.Start(t, &optsA)
	b := controlplanetest.Start(t, &optsB)

	stA := connect(t, a, hello("agent-a", key))
	recvPolicy(t, stA)
	stB := connect(t, b, hello("agent-b", key))
	recvPolicy(t, stB)

	list := func(srv *controlplanetest.Server) []*controlplanev1.Agent {
		t.Helper()
		resp, err := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil)).ListAgents(t.Context(), &controlplanev1.ListAgentsRequest{})
		if err != nil {
			t.Fatalf("ListAgents: %v", err)
		}
		return resp.GetAgents()
	}
	for name, srv := range map[string]*controlplanetest.Server{"A": a, "B": b} {
		got := list(srv)
		if len(got) != 2 || got[0].GetId() != "agent-a" || got[1].GetId() != "agent-b" {
			t.Fatalf("replica %s lists %v; want agent-a and agent-b", name, got)
		}
		for _, g := range got {
			if !g.GetLive() || g.GetHost() != "h" || g.GetVersion() != "v" || len(g.GetAccounts()) != 1 || g.GetAccounts()[0] != key {
				t.Errorf("replica %s lists %v; want live, host h, version v, accounts [%s]", name, g, key)
			}
		}
	}

	if err := stB.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Goodbye{Goodbye: &controlplanev1.AgentGoodbye{}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second) // a bound, not a speed assertion
	for {
		got := list(a)
		if len(got) == 1 && got[0].GetId() == "agent-a" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica A still lists %v after agent-b said goodbye to replica B", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
