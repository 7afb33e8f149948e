package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

type rawStream = grpc.BidiStreamingClient[controlplanev1.ConnectRequest, controlplanev1.ConnectResponse]

func hello(id string, accounts ...string) *controlplanev1.ConnectRequest {
	return &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Hello{Hello: &controlplanev1.AgentHello{
		AgentId: id, Host: "h", Version: "v", CapabilityVersion: 2, Accounts: accounts,
	}}}
}

func connect(t *testing.T, srv *controlplanetest.Server, first *controlplanev1.ConnectRequest) rawStream {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	st, err := controlplanev1.NewAgentServiceClient(srv.Dial(srv.AgentToken, nil)).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(first); err != nil {
		t.Fatal(err)
	}
	return st
}

// recvPolicy receives the next message and requires a policy push. A
// member push before it (an agent of CAPABILITY_VERSION_MEMBERS gets one
// after its hello) is skipped.
func recvPolicy(t *testing.T, st rawStream) *controlplanev1.PolicyPush {
	t.Helper()
	m, err := st.Recv()
	if err == nil && m.GetMembers() != nil {
		m, err = st.Recv()
	}
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	p := m.GetPolicy()
	if p == nil {
		t.Fatalf("Recv = %v, want a policy push", m)
	}
	return p
}

func TestAgentPushOnConnect(t *testing.T) {
	clk := newClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	st := connect(t, srv, hello("a-1-x", key))
	got := recvPolicy(t, st)
	want := &controlplanev1.PolicyPush{
		Account: key, RatePerMinute: 60, EffectiveRatePerMinute: 60, Burst: 10,
		IdleTimeoutMs: 120000, TotalTimeoutMs: 600000, MaxRetries: 5, WaitBoundMs: 4833,
		PolicyVersion: 0, LiveAgents: 1,
	}
	if got.String() != want.String() {
		t.Errorf("push = %v\nwant %v", got, want)
	}
}

// Shutdown ends every agent stream: an AgentClose with the reason, then
// Unavailable with the same message.
func TestShutdownClosesAgentStreams(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	st := connect(t, srv, hello("a-1-x", key))
	recvPolicy(t, st)
	stopped := make(chan struct{})
	go func() { srv.Stop(); close(stopped) }()
	m, err := st.Recv()
	if err != nil || m.GetClose().GetReason() != "control plane shutting down" {
		t.Fatalf("Recv = %v, %v; want AgentClose{control plane shutting down}", m, err)
	}
	_, err = st.Recv()
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "control plane shutting down" {
		t.Errorf("after the close: %v, want Unavailable: control plane shutting down", err)
	}
	<-stopped
}

// A second stream with the same agent id replaces the first.
func TestAgentSameIDReplaces(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	old := connect(t, srv, hello("a-1-x", key))
	recvPolicy(t, old)
	cur := connect(t, srv, hello("a-1-x", key))
	if p := recvPolicy(t, cur); p.GetLiveAgents() != 1 {
		t.Errorf("live agents = %d, want 1 (the old stream is replaced)", p.GetLiveAgents())
	}
	m, err := old.Recv()
	if err != nil || !strings.Contains(m.GetClose().GetReason(), "replaced") {
		t.Errorf("old stream: %v, %v; want a close naming the replacement", m, err)
	}
	if _, err := old.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("old stream then: %v, want Unavailable", err)
	}
}

func TestAgentBadInput(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	hb := func(accts ...string) *controlplanev1.ConnectRequest {
		return &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Heartbeat{Heartbeat: &controlplanev1.AgentHeartbeat{Accounts: accts}}}
	}
	r403 := func(acct string) *controlplanev1.ConnectRequest {
		return &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Upstream_403{Upstream_403: &controlplanev1.Upstream403{Account: acct}}}
	}
	badCap := hello("a-1-x", key)
	badCap.GetHello().CapabilityVersion = 0
	tests := []struct {
		name  string
		first *controlplanev1.ConnectRequest
		then  *controlplanev1.ConnectRequest // sent after the first push, when set
		want  string
	}{
		{"heartbeat first", hb(key), nil, "the first message must be a hello"},
		{"empty id", hello("", key), nil, "hello: agent_id is empty"},
		{"space in id", hello("a b", key), nil, "hello: agent_id has a byte 0x20 at 1; allowed printable ASCII without spaces"},
		{"long id", hello(strings.Repeat("x", 129), key), nil, "hello: agent_id is 129 bytes; allowed 1..128"},
		{"bad account", hello("a-1-x", "acct_XYZ"), nil, `hello: accounts[0] "acct_XYZ" is not an account key; want acct_ followed by 16 lowercase hex digits`},
		{"capability 0", badCap, nil, "hello: capability_version 0 is invalid; allowed 1..7"},
		{"heartbeat bad account", hello("a-1-x", key), hb("nope"), `heartbeat: accounts[0] "nope" is not an account key`},
		{"403 bad account", hello("a-1-x", key), r403("acct_1"), `upstream_403: account "acct_1" is not an account key`},
		{"second hello", hello("a-1-x", key), hello("a-1-x", key), "a second hello on one stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := connect(t, srv, tt.first)
			if tt.then != nil {
				recvPolicy(t, st)
				if err := st.Send(tt.then); err != nil {
					t.Fatal(err)
				}
			}
			_, err := st.Recv()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Errorf("Recv = %v, want InvalidArgument containing %q", err, tt.want)
			}
		})
	}
	// Nothing stays registered.
	resp, err := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil)).ListAgents(t.Context(), &controlplanev1.ListAgentsRequest{})
	if err != nil || len(resp.GetAgents()) != 0 {
		t.Errorf("ListAgents after bad input = %v, %v; want none", resp, err)
	}
}

func TestAgentAuth(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	// No token: Unauthenticated.
	st, err := controlplanev1.NewAgentServiceClient(srv.Dial(mustToken(t, "wrong"), nil)).Connect(t.Context())
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("Connect with a wrong token: %v, want Unauthenticated", err)
	}
	// The agent token may not list agents or set adaptive mode.
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AgentToken, nil))
	if _, err := admin.ListAgents(t.Context(), &controlplanev1.ListAgentsRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ListAgents with the agent token: %v, want PermissionDenied", err)
	}
	if _, err := admin.SetAdaptive(t.Context(), &controlplanev1.SetAdaptiveRequest{Key: key, Enabled: true}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("SetAdaptive with the agent token: %v, want PermissionDenied", err)
	}
}

func TestSetAdaptiveBadKey(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	_, err := admin.SetAdaptive(t.Context(), &controlplanev1.SetAdaptiveRequest{Key: "", Enabled: true})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "account key is empty") {
		t.Errorf("SetAdaptive(\"\") = %v, want InvalidArgument naming the empty key", err)
	}
}

// The adaptive timeline over the wire: a 403 through the agent stream
// lowers 60 to 42 and a quiet minute adds 6 (pushed by the fleet tick).
func TestAdaptiveOverTheStream(t *testing.T) {
	clk := newClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: 10 * time.Millisecond})
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	if _, err := admin.SetAdaptive(t.Context(), &controlplanev1.SetAdaptiveRequest{Key: key, Enabled: true}); err != nil {
		t.Fatal(err)
	}
	st := connect(t, srv, hello("a-1-x", key))
	if p := recvPolicy(t, st); p.GetEffectiveRatePerMinute() != 60 || !p.GetAdaptive() || p.GetPolicyVersion() != 1 {
		t.Fatalf("push on connect = %v, want effective 60, adaptive, version 1", p)
	}
	send403 := func(retryAfter time.Duration) {
		t.Helper()
		m := &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Upstream_403{Upstream_403: &controlplanev1.Upstream403{
			Account: key, Count: 1, RetryAfterMs: retryAfter.Milliseconds()}}}
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	start := clk.Now()
	send403(0)
	// Halved, and paused fleet-wide for the learned interval (60 s).
	if p := recvPolicy(t, st); p.GetEffectiveRatePerMinute() != 30 || p.GetRatePerMinute() != 60 ||
		p.GetPausedUntilUnixMs() != start.Add(time.Minute).UnixMilli() {
		t.Fatalf("push after a 403 = %v, want effective 30 of 60, paused until %d", p, start.Add(time.Minute).UnixMilli())
	}
	// The pause holds admissions: refused with the pause's end as the hint.
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	if r, err := admission.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key}); err != nil ||
		r.GetDecision() != controlplanev1.Decision_DECISION_REFUSE || r.GetRetryAfterMs() != 60000 || r.GetDebited() {
		t.Fatalf("Admit while paused = %v, %v; want a refusal with retry_after_ms 60000, nothing debited", r, err)
	}
	// (A second 403 within 10s is covered by the store's table test: over
	// the stream nothing acknowledges it, so the test could not order it
	// before the clock moves.) Heartbeats keep the agent live while the
	// clock moves in 10s steps; the quiet interval starts when the pause
	// ends.
	for range 8 {
		stepClock(t, clk, st, admin, 10*time.Second)
	}
	stepClock(t, clk, st, admin, 9*time.Second)
	acct, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: key})
	if err != nil || acct.GetAccount().GetEffectiveRatePerMinute() != 30 || acct.GetAccount().GetPausedUntilUnixMs() != 0 {
		t.Fatalf("29s after the pause: %v, %v; want effective 30, not paused", acct, err)
	}
	stepClock(t, clk, st, admin, time.Second)
	if p := recvPolicy(t, st); p.GetEffectiveRatePerMinute() != 36 {
		t.Fatalf("push after a quiet 30 s = %v, want effective 36", p)
	}
	// A 403 with a retry-after pauses exactly that long.
	send403(90 * time.Second)
	if p := recvPolicy(t, st); p.GetPausedUntilUnixMs() != clk.Now().Add(90*time.Second).UnixMilli() {
		t.Fatalf("push after a 403 with retry-after 90 s = %v, want paused until %d", p, clk.Now().Add(90*time.Second).UnixMilli())
	}
}

// stepClock advances clk by d (< 15s), then heartbeats and waits until the
// server has recorded the heartbeat at the new time.
func stepClock(t *testing.T, clk *clock, st rawStream, admin controlplanev1.AdminServiceClient, d time.Duration) {
	t.Helper()
	clk.Advance(d)
	hb := &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Heartbeat{Heartbeat: &controlplanev1.AgentHeartbeat{Accounts: []string{key}}}}
	if err := st.Send(hb); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := admin.ListAgents(t.Context(), &controlplanev1.ListAgentsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if a := resp.GetAgents(); len(a) == 1 && a[0].GetLastSeenUnixMs() == clk.Now().UnixMilli() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the heartbeat at %v never arrived: %v", clk.Now(), resp)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// GetAccount, ListAccounts and /metrics carry the account's decisions and
// reported 403s, counted by this server since it started.
func TestAccountCounters(t *testing.T) {
	reg := prometheus.NewRegistry()
	clk := newClock()
	start := clk.Now()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, Registerer: reg, FleetTick: 10 * time.Millisecond})
	srv.Register(key)
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	// Default policy 60/min burst 10, wait bound 4833 ms: 10 admits, 4
	// waits (1..4 s), then a refusal.
	for range 15 {
		if _, err := admission.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.SetAdaptive(t.Context(), &controlplanev1.SetAdaptiveRequest{Key: key, Enabled: true}); err != nil {
		t.Fatal(err)
	}
	st := connect(t, srv, hello("a-1-x", key))
	recvPolicy(t, st)
	m := &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Upstream_403{Upstream_403: &controlplanev1.Upstream403{Account: key, Count: 3}}}
	if err := st.Send(m); err != nil {
		t.Fatal(err)
	}
	recvPolicy(t, st) // the report has been applied: adaptive pushed its lower rate

	get, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	list, err := admin.ListAccounts(t.Context(), &controlplanev1.ListAccountsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetAccounts()) != 1 {
		t.Fatalf("ListAccounts = %v, want one account", list)
	}
	for name, a := range map[string]*controlplanev1.Account{"GetAccount": get.GetAccount(), "ListAccounts": list.GetAccounts()[0]} {
		if !a.GetCounted() || a.GetAdmits() != 10 || a.GetWaits() != 4 || a.GetRefusals() != 1 || a.GetForbiddenUpgrades() != 3 ||
			a.GetCountersSinceUnixMs() != start.UnixMilli() {
			t.Errorf("%s counters: counted %v admits %d waits %d refusals %d 403s %d since %d; want true 10 4 1 3 %d",
				name, a.GetCounted(), a.GetAdmits(), a.GetWaits(), a.GetRefusals(), a.GetForbiddenUpgrades(), a.GetCountersSinceUnixMs(), start.UnixMilli())
		}
	}
	got := gather(t, reg)
	for name, w := range map[string]float64{
		`clodex_controlplane_account_admissions_total{account="` + key + `",decision="admit"}`:  10,
		`clodex_controlplane_account_admissions_total{account="` + key + `",decision="wait"}`:   4,
		`clodex_controlplane_account_admissions_total{account="` + key + `",decision="refuse"}`: 1,
		`clodex_controlplane_account_upstream_403_total{account="` + key + `"}`:                 3,
		`clodex_controlplane_upstream_403_total{}`:                                              3,
	} {
		if v, ok := got[name]; !ok || v != w {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, w)
		}
	}
	// An account this server never admitted is not counted.
	other := account.Key("never-admitted")
	if _, err := admin.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: other, RatePerMinute: 30}); err != nil {
		t.Fatal(err)
	}
	o, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: other})
	if err != nil {
		t.Fatal(err)
	}
	if o.GetAccount().GetCounted() || o.GetAccount().GetAdmits() != 0 {
		t.Errorf("never admitted account: counted %v admits %d; want false 0", o.GetAccount().GetCounted(), o.GetAccount().GetAdmits())
	}
}
