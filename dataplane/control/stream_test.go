package control_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

func listAgents(t *testing.T, admin controlplanev1.AdminServiceClient) []*controlplanev1.Agent {
	t.Helper()
	resp, err := admin.ListAgents(t.Context(), &controlplanev1.ListAgentsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetAgents()
}

// An agent registers, receives its accounts' policy on connect, shows up
// in ListAgents, and deregisters when it stops.
func TestRegisterPushAndDeregister(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	admin := adminClient(srv)
	a := startAgent(t, srv, clk, "h1-100-aaaa", keyB, keyA, keyA)

	// The default policy: 60/min, burst 10, the default budget (bound 4833ms).
	want := pacing.DefaultPolicy()
	for _, k := range []string{keyA, keyB} {
		p := a.rec.waitFor(t, "on connect", k, func(push) bool { return true })
		if p.policy != want || p.live != 1 {
			t.Errorf("push for %s = %+v live %d, want %+v live 1", k, p.policy, p.live, want)
		}
	}
	if got := a.LiveAgents(keyA); got != 1 {
		t.Errorf("LiveAgents = %d, want 1", got)
	}
	agents := listAgents(t, admin)
	if len(agents) != 1 {
		t.Fatalf("ListAgents = %v, want one agent", agents)
	}
	g := agents[0]
	wantAgent := &controlplanev1.Agent{
		Id: "h1-100-aaaa", Host: "host-h1-100-aaaa", Version: "v1.2.3", CapabilityVersion: 7,
		Accounts:       []string{keyA, keyB}, // sorted, distinct
		LastSeenUnixMs: clk.Now().UnixMilli(), ConnectedUnixMs: clk.Now().UnixMilli(), Live: true,
	}
	if !proto.Equal(g, wantAgent) {
		t.Errorf("ListAgents[0] = %v\nwant %v", g, wantAgent)
	}

	a.stop() // says goodbye
	if got := listAgents(t, admin); len(got) != 0 {
		t.Errorf("after the agent stopped, ListAgents = %v, want none", got)
	}
}

// set-rate reaches every connected agent of the account, and live counts
// follow agents joining and leaving.
func TestSetRateReachesEveryAgent(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	admin := adminClient(srv)
	a1 := startAgent(t, srv, clk, "h1-1-a", keyA)
	a1.rec.waitFor(t, "on connect", keyA, func(push) bool { return true })
	a2 := startAgent(t, srv, clk, "h2-2-b", keyA, keyB)
	other := startAgent(t, srv, clk, "h3-3-c", keyB)
	for _, a := range []*running{a1, a2} {
		a.rec.waitFor(t, "with live 2", keyA, func(p push) bool { return p.live == 2 })
	}
	other.rec.waitFor(t, "with live 2", keyB, func(p push) bool { return p.live == 2 })
	if got := a1.LiveAgents(keyA); got != 2 {
		t.Errorf("LiveAgents(A) = %d, want 2", got)
	}

	otherBefore := other.rec.count()
	if _, err := admin.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: keyA, RatePerMinute: 120, Burst: proto.Int32(20)}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []*running{a1, a2} {
		p := a.rec.waitFor(t, "at 120/min", keyA, func(p push) bool { return p.policy.RatePerMinute == 120 })
		if p.policy.Burst != 20 || p.live != 2 {
			t.Errorf("push = %+v live %d, want burst 20 live 2", p.policy, p.live)
		}
	}
	if _, err := admin.SetBudget(t.Context(), &controlplanev1.SetBudgetRequest{Key: keyA, MaxRetries: proto.Int32(3)}); err != nil {
		t.Fatal(err)
	}
	a1.rec.waitFor(t, "with 3 retries", keyA, func(p push) bool { return p.policy.Budget.MaxRetries == 3 })

	// a2 leaves: a1 learns it is alone on A, other alone on B.
	a2.stop()
	a1.rec.waitFor(t, "with live 1", keyA, func(p push) bool { return p.live == 1 })
	other.rec.waitFor(t, "with live 1", keyB, func(p push) bool { return p.live == 1 })
	if got := other.rec.count(); got < otherBefore {
		t.Fatalf("pushes went backwards")
	}
}

// An agent whose heartbeats stop is not live after 15 s; the server then
// closes its stream with the reason, and the agent registers again.
func TestLivenessExpiry(t *testing.T) {
	clk := newFakeClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: time.Hour})
	admin := adminClient(srv)
	a := startAgent(t, srv, clk, "h1-1-a", keyA)
	a.rec.waitFor(t, "on connect", keyA, func(push) bool { return true })

	clk.Advance(14 * time.Second)
	if ag := listAgents(t, admin); len(ag) != 1 || !ag[0].GetLive() {
		t.Fatalf("14s after the hello: %v, want live", ag)
	}
	clk.Advance(time.Second)
	if ag := listAgents(t, admin); len(ag) != 1 || ag[0].GetLive() {
		t.Fatalf("15s after the hello: %v, want registered but not live", ag)
	}
}

func TestExpiredAgentIsClosedAndReconnects(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk) // fleet tick 10ms
	admin := adminClient(srv)
	a := startAgent(t, srv, clk, "h1-1-a", keyA)
	a.rec.waitFor(t, "on connect", keyA, func(push) bool { return true })
	first := a.rec.count()

	clk.Advance(16 * time.Second)
	// The reconnect's hello brings a fresh push.
	eventually(t, "a push after the reconnect", func() bool { return a.rec.count() > first })
	if got := a.CloseReason(); got != "no heartbeat for 15s" {
		t.Errorf("CloseReason = %q, want %q", got, "no heartbeat for 15s")
	}
	ag := listAgents(t, admin)
	if len(ag) != 1 || !ag[0].GetLive() || ag[0].GetLastSeenUnixMs() != clk.Now().UnixMilli() {
		t.Errorf("after the reconnect: %v, want live, last seen now", ag)
	}
}

// Heartbeats keep an agent live and carry account changes: a data plane
// taking its tokens from the broker serves the accounts the broker learns.
func TestHeartbeatKeepsLiveAndUpdatesAccounts(t *testing.T) {
	clk := newFakeClock()
	idp := startIdP(t)
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: time.Hour, Broker: true, TokenEndpoint: idp.endpoint})
	admin := adminClient(srv)
	idp.login(t, admin, "acct-a")
	rec := newRecorder()
	cfg := agentConfig(srv, clk, rec, "h-1-x") // the broker's accounts
	cfg.Broker = true
	cfg.Heartbeat = 20 * time.Millisecond
	run(t, cfg, rec)
	ka, kb := account.Key("acct-a"), account.Key("acct-b")
	rec.waitFor(t, "on connect", ka, func(push) bool { return true })

	idp.login(t, admin, "acct-b")
	clk.Advance(time.Minute) // past the broker's accounts poll: acct-b is learned
	rec.waitFor(t, "after the heartbeat added it", kb, func(push) bool { return true })
	clk.Advance(time.Minute)
	eventually(t, "a heartbeat at the new time", func() bool {
		l := listAgents(t, admin)
		return len(l) == 1 && l[0].GetLive() && l[0].GetLastSeenUnixMs() == clk.Now().UnixMilli() && len(l[0].GetAccounts()) == 2
	})
}

// Report403 reaches the control plane with its retry-after: in adaptive
// mode the effective rate halves to 30 and every agent hears it; 30 quiet
// seconds after the pause (the 20 s retry-after) raise it by 6.
func TestReport403AdaptsTheFleet(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	admin := adminClient(srv)
	a1 := startAgentHB(t, srv, clk, 20*time.Millisecond, "h1-1-a", keyA)
	a2 := startAgentHB(t, srv, clk, 20*time.Millisecond, "h2-2-b", keyA)
	a1.rec.waitFor(t, "with live 2", keyA, func(p push) bool { return p.live == 2 })

	if _, err := admin.SetAdaptive(t.Context(), &controlplanev1.SetAdaptiveRequest{Key: keyA, Enabled: true}); err != nil {
		t.Fatal(err)
	}
	a2.rec.waitFor(t, "with adaptive on", keyA, func(p push) bool { return p.policy.RatePerMinute == 60 })
	got, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: keyA})
	if err != nil || got.GetAccount().GetEffectiveRatePerMinute() != 60 || !got.GetAccount().GetAdaptive() {
		t.Fatalf("GetAccount = %v, %v; want effective 60, adaptive", got, err)
	}

	a1.Report403(keyA, 20*time.Second)
	for _, a := range []*running{a1, a2} {
		a.rec.waitFor(t, "at 30/min", keyA, func(p push) bool { return p.policy.RatePerMinute == 30 })
	}
	acct, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: keyA})
	if err != nil {
		t.Fatal(err)
	}
	if a := acct.GetAccount(); a.GetRatePerMinute() != 60 || a.GetEffectiveRatePerMinute() != 30 ||
		a.GetPausedUntilUnixMs() != clk.Now().Add(20*time.Second).UnixMilli() {
		t.Errorf("GetAccount = rate %d effective %d paused until %d, want 60 and 30, paused for the 20 s retry-after", a.GetRatePerMinute(), a.GetEffectiveRatePerMinute(), a.GetPausedUntilUnixMs())
	}

	// The pause and 30 s without a 403, in steps the heartbeats keep up with.
	for range 5 {
		stepClock(t, clk, admin, 10*time.Second, 2)
	}
	for _, a := range []*running{a1, a2} {
		a.rec.waitFor(t, "at 36/min", keyA, func(p push) bool { return p.policy.RatePerMinute == 36 })
		if r := a.CloseReason(); r != "" {
			t.Errorf("the agent's stream was closed (%q); want the raise pushed on the open stream", r)
		}
	}
}

// Reports queued while the control plane is away are sent on reconnect.
func TestReport403QueuedWhileDisconnected(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	admin := adminClient(srv)
	if _, err := admin.SetAdaptive(t.Context(), &controlplanev1.SetAdaptiveRequest{Key: keyA, Enabled: true}); err != nil {
		t.Fatal(err)
	}
	// No agent is running yet: the report waits in the queue.
	rec := newRecorder()
	c, err := control.New(agentConfig(srv, clk, rec, "late-1-z", keyA))
	if err != nil {
		t.Fatal(err)
	}
	c.Report403(keyA, 0)
	c.Report403(keyA, 0)
	c.Report403("not-a-key", 0) // dropped
	a := runClient(t, c, rec)
	a.rec.waitFor(t, "at 30/min", keyA, func(p push) bool { return p.policy.RatePerMinute == 30 })
}

// Shutdown closes agent streams with the reason; the agent keeps trying
// and registers with the next server on the same address.
func TestShutdownClosesWithReasonAndAgentReconnects(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	a := startAgent(t, srv, clk, "h1-1-a", keyA)
	a.rec.waitFor(t, "on connect", keyA, func(push) bool { return true })
	before := a.rec.count()

	srv.Restart()
	eventually(t, "a push from the restarted server", func() bool { return a.rec.count() > before })
	if got := a.CloseReason(); got != "control plane shutting down" {
		t.Errorf("CloseReason = %q, want %q", got, "control plane shutting down")
	}
	if ag := listAgents(t, adminClient(srv)); len(ag) != 1 || ag[0].GetId() != "h1-1-a" {
		t.Errorf("after restart ListAgents = %v, want h1-1-a", ag)
	}
}

func TestNewID(t *testing.T) {
	tests := []struct {
		host, prefix string
	}{
		{"build-7", "build-7-4242-"},
		{"my host/α", "my_host___-4242-"},
		{"", "host-4242-"},
	}
	for _, tt := range tests {
		id := control.NewID(tt.host, 4242)
		if !strings.HasPrefix(id, tt.prefix) || len(id) != len(tt.prefix)+8 {
			t.Errorf("NewID(%q) = %q, want %q + 8 hex digits", tt.host, id, tt.prefix)
		}
		if err := control.ValidateID(id); err != nil {
			t.Errorf("NewID(%q) = %q is not a valid id: %v", tt.host, id, err)
		}
	}
	if a, b := control.NewID("h", 1), control.NewID("h", 1); a == b {
		t.Errorf("NewID twice = %q both times, want different random parts", a)
	}
}

func TestLiveAgentsDefaultsToOne(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	a, err := control.New(control.Config{Target: srv.Addr, Token: srv.AgentToken, AgentID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := a.LiveAgents(keyA); got != 1 {
		t.Errorf("LiveAgents before any push = %d, want 1", got)
	}
}
