package controlplane_test

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

var key2 = account.Key("chatgpt-account-2")

// helloUsage is a hello of an agent of capability USAGE.
func helloUsage(id string, accounts ...string) *controlplanev1.ConnectRequest {
	h := hello(id, accounts...)
	h.GetHello().CapabilityVersion = int32(controlplanev1.CapabilityVersion_CAPABILITY_VERSION_USAGE)
	return h
}

func usageRow(minute time.Time, member, acct, model string, turns, in, cached, out, sockets, refused int64) *controlplanev1.UsageRow {
	return &controlplanev1.UsageRow{MinuteUnixMs: minute.Truncate(time.Minute).UnixMilli(), Member: member, Account: acct, Model: model,
		Turns: turns, InputTokens: in, CachedTokens: cached, OutputTokens: out, NewSockets: sockets, Refusals: refused}
}

func sendUsage(t *testing.T, st rawStream, seq uint64, rows ...*controlplanev1.UsageRow) {
	t.Helper()
	if err := st.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Usage{Usage: &controlplanev1.UsageReport{Seq: seq, Rows: rows}}}); err != nil {
		t.Fatal(err)
	}
}

// recvAck receives until the next usage ack (policy and quota pushes are
// skipped).
func recvAck(t *testing.T, st rawStream) *controlplanev1.UsageAck {
	t.Helper()
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("Recv waiting for a usage ack: %v", err)
		}
		if a := m.GetUsageAck(); a != nil {
			return a
		}
	}
}

func getUsage(t *testing.T, admin controlplanev1.AdminServiceClient, by ...string) []*controlplanev1.UsageTotals {
	t.Helper()
	resp, err := admin.GetUsage(t.Context(), &controlplanev1.GetUsageRequest{GroupBy: by})
	if err != nil {
		t.Fatalf("GetUsage(%v): %v", by, err)
	}
	return resp.GetRows()
}

func totalsString(rows []*controlplanev1.UsageTotals) string {
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "[%s|%s|%s|%s t%d i%d c%d o%d s%d r%d]", r.GetMember(), r.GetAgent(), r.GetAccount(), r.GetModel(),
			r.GetTurns(), r.GetInputTokens(), r.GetCachedTokens(), r.GetOutputTokens(), r.GetNewSockets(), r.GetRefusals())
	}
	return b.String()
}

// A usage report is acknowledged once stored; the same batch sent again
// is acknowledged again and counted once (in the ledger and the
// metrics). The stream's headers name the control plane's capability
// version. GetUsage groups by the keys asked for, leaving the others
// empty.
func TestUsageReportStoredOnce(t *testing.T) {
	clk := newClock()
	reg := prometheus.NewRegistry()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, Registerer: reg, MemberMetrics: true})
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	st := connect(t, srv, helloUsage("dp-1", key, key2))
	recvPolicy(t, st)
	md, err := st.Header()
	if v := md.Get(controlplane.CapabilityHeader); err != nil || len(v) != 1 || v[0] != "7" {
		t.Errorf("stream header %s = %v, %v; want [7]", controlplane.CapabilityHeader, v, err)
	}
	now := clk.Now()
	rows := []*controlplanev1.UsageRow{
		usageRow(now, "alice", key, "claude-sonnet-4-5", 3, 3000, 2000, 300, 1, 0),
		usageRow(now, "bob", key2, "claude-haiku-4-5", 2, 400, 0, 40, 2, 1),
		usageRow(now.Add(-time.Minute), "alice", key, "claude-sonnet-4-5", 1, 1000, 0, 100, 1, 0),
	}
	sendUsage(t, st, 1, rows...)
	if a := recvAck(t, st); a.GetSeq() != 1 || a.GetRefused() != "" {
		t.Fatalf("ack = %v, want seq 1 stored", a)
	}
	sendUsage(t, st, 1, rows...) // sent again: a reconnect that lost the ack
	if a := recvAck(t, st); a.GetSeq() != 1 || a.GetRefused() != "" {
		t.Fatalf("ack of the resend = %v, want seq 1", a)
	}
	want := "[alice||| t4 i4000 c2000 o400 s2 r0][bob||| t2 i400 c0 o40 s2 r1]"
	if got := totalsString(getUsage(t, admin, "member")); got != want {
		t.Errorf("by member = %s\nwant %s", got, want)
	}
	want = "[|dp-1|" + key + "|claude-sonnet-4-5 t4 i4000 c2000 o400 s2 r0][|dp-1|" + key2 + "|claude-haiku-4-5 t2 i400 c0 o40 s2 r1]"
	if key2 < key {
		want = "[|dp-1|" + key2 + "|claude-haiku-4-5 t2 i400 c0 o40 s2 r1][|dp-1|" + key + "|claude-sonnet-4-5 t4 i4000 c2000 o400 s2 r0]"
	}
	if got := totalsString(getUsage(t, admin, "model", "agent", "account")); got != want {
		t.Errorf("by model, agent, account = %s\nwant %s", got, want)
	}
	if got := totalsString(getUsage(t, admin)); got != "[||| t6 i4400 c2000 o440 s4 r1]" {
		t.Errorf("totals = %s, want one row of 6 turns", got)
	}

	m := gather(t, reg)
	for name, w := range map[string]float64{
		`clodex_controlplane_usage_turns_total{account="` + key + `",agent="dp-1"}`:            4,
		`clodex_controlplane_usage_input_tokens_total{account="` + key + `",agent="dp-1"}`:     4000,
		`clodex_controlplane_usage_cached_tokens_total{account="` + key + `",agent="dp-1"}`:    2000,
		`clodex_controlplane_usage_output_tokens_total{account="` + key2 + `",agent="dp-1"}`:   40,
		`clodex_controlplane_usage_new_sockets_total{account="` + key2 + `",agent="dp-1"}`:     2,
		`clodex_controlplane_usage_refusals_total{account="` + key2 + `",agent="dp-1"}`:        1,
		`clodex_controlplane_usage_member_turns_total{account="` + key + `",member="alice"}`:   4,
		`clodex_controlplane_usage_member_refusals_total{account="` + key2 + `",member="bob"}`: 1,
	} {
		if v, ok := m[name]; !ok || v != w {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, w)
		}
	}
}

// Without --member-metrics the usage counters have no member label.
func TestUsageMetricsWithoutMembers(t *testing.T) {
	clk := newClock()
	reg := prometheus.NewRegistry()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, Registerer: reg})
	st := connect(t, srv, helloUsage("dp-1", key))
	recvPolicy(t, st)
	sendUsage(t, st, 1, usageRow(clk.Now(), "alice", key, "m", 1, 10, 0, 1, 0, 0))
	recvAck(t, st)
	for name := range gather(t, reg) {
		if strings.Contains(name, "usage_member") {
			t.Errorf("metric %s without --member-metrics", name)
		}
	}
	if v := gather(t, reg)[`clodex_controlplane_usage_turns_total{account="`+key+`",agent="dp-1"}`]; v != 1 {
		t.Errorf("usage turns by account and agent = %v, want 1", v)
	}
}

// A report the control plane will never store is acknowledged as refused,
// with the reason, and nothing of it is counted; the stream stays open.
func TestUsageReportRefused(t *testing.T) {
	clk := newClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	st := connect(t, srv, helloUsage("dp-1", key))
	recvPolicy(t, st)
	now := clk.Now()
	good := usageRow(now, "alice", key, "m", 1, 10, 0, 1, 0, 0)
	long := strings.Repeat("m", 65)
	for i, tt := range []struct {
		row  *controlplanev1.UsageRow
		want string
	}{
		{usageRow(now, "alice", "acct-1", "m", 1, 1, 0, 1, 0, 0), `usage.rows[1].account "acct-1" is not an account key`},
		{usageRow(now.Add(-31*24*time.Hour), "alice", key, "m", 1, 1, 0, 1, 0, 0), "usage.rows[1].minute_unix_ms 2026-10-30T12:00:00Z is out of range; allowed the last 720h0m0s up to 1h0m0s ahead"},
		{usageRow(now.Add(2*time.Hour), "alice", key, "m", 1, 1, 0, 1, 0, 0), "is out of range"},
		{&controlplanev1.UsageRow{MinuteUnixMs: now.UnixMilli() + 1, Account: key, Model: "m", Turns: 1}, "is not a minute's start"},
		{usageRow(now, "alice", key, long, 1, 1, 0, 1, 0, 0), "usage.rows[1].model is 65 bytes; allowed 1..64"},
		{usageRow(now, "al\tice", key, "m", 1, 1, 0, 1, 0, 0), "usage.rows[1].member has a byte 0x09"},
		{usageRow(now, "alice", key, "m", -1, 1, 0, 1, 0, 0), "usage.rows[1].turns -1 is out of range"},
		{usageRow(now, "alice", key, "m", 1, 1, 0, 1, 0, 0), "usage.rows[1] repeats the minute, member, account and model of an earlier row"},
	} {
		seq := uint64(i + 1)
		sendUsage(t, st, seq, good, tt.row)
		a := recvAck(t, st)
		if a.GetSeq() != seq || !strings.Contains(a.GetRefused(), tt.want) {
			t.Errorf("report %d: ack = %v; want seq %d refused with %q", i, a, seq, tt.want)
		}
	}
	sendUsage(t, st, 0, good)
	if a := recvAck(t, st); !strings.Contains(a.GetRefused(), "usage: seq is 0") {
		t.Errorf("seq 0: ack = %v, want refused naming seq", a)
	}
	sendUsage(t, st, 100, good)
	if a := recvAck(t, st); a.GetSeq() != 100 || a.GetRefused() != "" {
		t.Errorf("a good report after the refused ones: ack = %v, want seq 100 stored", a)
	}
	if got := totalsString(getUsage(t, admin)); got != "[||| t1 i10 c0 o1 s0 r0]" {
		t.Errorf("totals = %s; want only the last good report's turn", got)
	}
}

// An agent credential scoped to one account cannot report usage of
// another: the batch is refused, naming the account.
func TestUsageScopedCredential(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	a, b := account.Key("acct-a"), account.Key("acct-b")
	tok, err := bearer.Parse("scoped-agent-token-for-usage")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(tok.Reveal()))
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	if _, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{Name: "team-a", Accounts: []string{a}, TokenSha256: sum[:]}); err != nil {
		t.Fatal(err)
	}
	st, err := controlplanev1.NewAgentServiceClient(srv.Dial(tok, nil)).Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(helloUsage("dp-a", a)); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	sendUsage(t, st, 1, usageRow(now, "", a, "m", 1, 1, 0, 1, 0, 0), usageRow(now, "", b, "m", 1, 1, 0, 1, 0, 0))
	if ack := recvAck(t, st); !strings.Contains(ack.GetRefused(), "usage.rows[1].account "+b+" is not one this agent credential may use") {
		t.Errorf("ack = %v; want refused naming %s", ack, b)
	}
	sendUsage(t, st, 2, usageRow(now, "", a, "m", 1, 1, 0, 1, 0, 0))
	if ack := recvAck(t, st); ack.GetRefused() != "" {
		t.Errorf("a report of its own account: ack = %v, want stored", ack)
	}
}

// GetUsage's arguments: each key once and known, since before until and
// within the 30 days kept; by default the last 24 hours.
func TestGetUsageArguments(t *testing.T) {
	clk := newClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	now := clk.Now()
	for _, tt := range []struct {
		req  *controlplanev1.GetUsageRequest
		want string
	}{
		{&controlplanev1.GetUsageRequest{GroupBy: []string{"team"}}, `group_by[0] "team" is not a key; allowed member, agent, account, model`},
		{&controlplanev1.GetUsageRequest{GroupBy: []string{"model", "model"}}, `group_by names "model" twice`},
		{&controlplanev1.GetUsageRequest{SinceUnixMs: now.Add(-31 * 24 * time.Hour).UnixMilli()}, "is more than 720h0m0s back; the ledger keeps 720h0m0s"},
		{&controlplanev1.GetUsageRequest{SinceUnixMs: now.UnixMilli(), UntilUnixMs: now.Add(-time.Hour).UnixMilli()}, "is not before until"},
		{&controlplanev1.GetUsageRequest{SinceUnixMs: -5}, "must not be negative"},
	} {
		_, err := admin.GetUsage(t.Context(), tt.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("GetUsage(%v) = %v, want InvalidArgument containing %q", tt.req, err, tt.want)
		}
	}
	st := connect(t, srv, helloUsage("dp-1", key))
	recvPolicy(t, st)
	sendUsage(t, st, 1, usageRow(now.Add(-25*time.Hour), "old", key, "m", 5, 1, 0, 1, 0, 0), usageRow(now, "new", key, "m", 1, 1, 0, 1, 0, 0))
	recvAck(t, st)
	if got := totalsString(getUsage(t, admin, "member")); got != "[new||| t1 i1 c0 o1 s0 r0]" {
		t.Errorf("by member over the default 24 hours = %s; want the new row only", got)
	}
	resp, err := admin.GetUsage(t.Context(), &controlplanev1.GetUsageRequest{GroupBy: []string{"member"}, SinceUnixMs: now.Add(-48 * time.Hour).UnixMilli()})
	if err != nil || totalsString(resp.GetRows()) != "[new||| t1 i1 c0 o1 s0 r0][old||| t5 i1 c0 o1 s0 r0]" {
		t.Errorf("by member over 48 hours = %s, %v; want both rows", totalsString(resp.GetRows()), err)
	}
	if resp.GetSinceUnixMs() != now.Add(-48*time.Hour).UnixMilli() || resp.GetUntilUnixMs() != now.Add(time.Minute).UnixMilli() {
		t.Errorf("summed %d..%d, want %d..%d (until's minute included)", resp.GetSinceUnixMs(), resp.GetUntilUnixMs(),
			now.Add(-48*time.Hour).UnixMilli(), now.Add(time.Minute).UnixMilli())
	}
}

// Replicas over one Redis share the ledger: a batch stored through one
// replica, its ack lost, and sent again through another after the agent
// reconnects there is acknowledged and counted once; the ledger survives
// a replica's restart.
func TestUsageAcrossReplicas(t *testing.T) {
	rs := redistest.Start(t)
	clk := newClock()
	base := controlplanetest.Options{Now: clk.Now, RedisURL: rs.URL, RedisPrefix: "usage:", RedisTimeout: 5 * time.Second}
	ao, bo := base, base
	ao.Replica, bo.Replica = "cp-a", "cp-b"
	a := controlplanetest.Start(t, &ao)
	bo.Tokens = a
	b := controlplanetest.Start(t, &bo)
	rows := []*controlplanev1.UsageRow{usageRow(clk.Now(), "alice", key, "m", 2, 20, 10, 2, 1, 0)}
	sa := connect(t, a, helloUsage("dp-1", key))
	recvPolicy(t, sa)
	sendUsage(t, sa, 1, rows...)
	recvAck(t, sa)
	sb := connect(t, b, helloUsage("dp-1", key)) // the same agent, reconnected to b
	recvPolicy(t, sb)
	sendUsage(t, sb, 1, rows...)
	if ack := recvAck(t, sb); ack.GetSeq() != 1 || ack.GetRefused() != "" {
		t.Errorf("ack from the other replica = %v, want seq 1", ack)
	}
	sendUsage(t, sb, 2, usageRow(clk.Now(), "bob", key, "m", 1, 5, 0, 1, 0, 0))
	recvAck(t, sb)
	b.Restart()
	for _, srv := range []*controlplanetest.Server{a, b} {
		admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
		if got := totalsString(getUsage(t, admin, "member")); got != "[alice||| t2 i20 c10 o2 s1 r0][bob||| t1 i5 c0 o1 s0 r0]" {
			t.Errorf("by member through %s = %s; want alice's 2 turns once and bob's 1", srv.Addr, got)
		}
	}
}
