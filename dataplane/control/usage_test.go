package control_test

import (
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// proxy forwards TCP connections to a control plane; hold stops the
// answers (control plane to data plane) from going through, and cut
// drops every connection.
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex // guards the following fields
	conns  []net.Conn
	held   bool
	thawed chan struct{} // closed when hold ends
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, thawed: make(chan struct{})}
	close(p.thawed)
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.copyUp(s, c)
		go p.copyDown(c, s)
	}
}

// copyUp forwards the data plane's bytes.
func (p *proxy) copyUp(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
}

// copyDown forwards the control plane's bytes, waiting while held.
func (p *proxy) copyDown(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			thawed := p.thawed
			p.mu.Unlock()
			<-thawed
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// hold keeps the control plane's answers from reaching the data plane.
func (p *proxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held {
		p.held, p.thawed = true, make(chan struct{})
	}
}

// cut drops every connection and lets answers through again; what was
// held is lost with its connection.
func (p *proxy) cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	for _, c := range conns {
		_ = c.Close()
	}
	if p.held {
		p.held = false
		close(p.thawed)
	}
	p.mu.Unlock()
}

// ledgerTurns is the ledger's turns of member m (all members for "").
func ledgerTurns(t *testing.T, admin controlplanev1.AdminServiceClient, m string) int64 {
	t.Helper()
	resp, err := admin.GetUsage(t.Context(), &controlplanev1.GetUsageRequest{GroupBy: []string{"member"}})
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, r := range resp.GetRows() {
		if m == "" || r.GetMember() == m {
			n += r.GetTurns()
		}
	}
	return n
}

func turn(member, acct string, in, out int64) *controlplanev1.UsageRow {
	return &controlplanev1.UsageRow{Member: member, Account: acct, Model: "claude-sonnet-4-5", Turns: 1, InputTokens: in, CachedTokens: in / 2, OutputTokens: out, NewSockets: 1}
}

// A reconnect mid-batch: the control plane stored a batch but its ack
// never reached the data plane (the connection dropped first). The data
// plane keeps the batch, sends it again on its next stream, and the
// control plane acknowledges it without counting it again: the ledger
// holds every turn once. Later turns go in new batches.
func TestUsageReconnectMidBatch(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	admin := adminClient(srv)
	p := startProxy(t, srv.Addr)
	rec := newRecorder()
	cfg := agentConfig(srv, clk, rec, "h1-1-a", keyA)
	cfg.Target, cfg.UsageFlush = p.addr(), 20*time.Millisecond
	a := run(t, cfg, rec)
	rec.waitFor(t, "on connect", keyA, func(push) bool { return true })

	p.hold() // the answers stop here: acks included
	for range 3 {
		a.ReportUsage(turn("alice", keyA, 1000, 10))
	}
	a.ReportUsage(turn("bob", keyA, 500, 5))
	eventually(t, "the batch stored", func() bool { return ledgerTurns(t, admin, "") == 4 })
	if st := a.UsageStats(); st.Batches != 1 || st.Acked != 0 {
		t.Fatalf("with the ack held: %+v, want one batch waiting and none acknowledged", st)
	}
	p.cut() // the stream drops before the ack arrives

	eventually(t, "the batch acknowledged after the reconnect", func() bool { return a.UsageStats().Batches == 0 })
	st := a.UsageStats()
	if st.Acked != 1 || st.Resent < 1 || st.Dropped != 0 {
		t.Errorf("after the reconnect: %+v; want 1 acknowledged, sent again at least once, none dropped", st)
	}
	if got := ledgerTurns(t, admin, "alice"); got != 3 {
		t.Errorf("alice's turns in the ledger = %d, want 3 (the batch counted once)", got)
	}
	a.ReportUsage(turn("alice", keyA, 1000, 10))
	eventually(t, "the next batch stored", func() bool { return ledgerTurns(t, admin, "") == 5 })
	eventually(t, "the next batch acknowledged", func() bool { return a.UsageStats().Acked == 2 })
}

// Usage recorded while the control plane is away waits (aggregated per
// minute), then goes out once it answers; usage older than an hour is
// dropped and counted, never sent.
func TestUsageWaitsAnHourAtMost(t *testing.T) {
	clk := newFakeClock()
	addr := closedAddr(t)
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	c, err := control.New(control.Config{Target: addr, Token: tok(t, "agent-token"), AgentID: "h1-1-a", Accounts: []string{keyA},
		Clock: clk.Now, Logger: rec.logger(), Registerer: reg, UsageFlush: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c, rec)
	c.ReportUsage(turn("alice", keyA, 10, 1))
	c.ReportUsage(turn("alice", keyA, 10, 1))
	clk.Advance(30 * time.Minute)
	c.ReportUsage(turn("bob", keyA, 10, 1))
	if st := c.UsageStats(); st.Rows != 2 || st.Dropped != 0 {
		t.Errorf("after 30 minutes away: %+v, want alice's and bob's rows waiting", st)
	}
	clk.Advance(31 * time.Minute) // alice's minute is 61 minutes old
	c.ReportUsage(turn("carol", keyA, 10, 1))
	if st := c.UsageStats(); st.Rows != 2 || st.Dropped != 2 {
		t.Errorf("61 minutes on: %+v, want alice's 2 turns dropped and bob's and carol's rows waiting", st)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "clodex_dataplane_usage_dropped_turns_total" {
			found = mf.GetMetric()[0].GetCounter().GetValue() == 2
		}
	}
	if !found {
		t.Error("clodex_dataplane_usage_dropped_turns_total is not 2")
	}
	if !strings.Contains(rec.text(), "dropping usage the control plane has not acknowledged") {
		t.Errorf("no warning of the drop in the log:\n%s", rec.text())
	}
}

// A batch the control plane refuses (a scoped credential reporting
// another account's usage) is forgotten and its turns counted as
// refused; the next batch is stored.
func TestUsageRefusedBatch(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	admin := adminClient(srv)
	scoped, err := bearer.Parse("scoped-usage-agent-token")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(scoped.Reveal()))
	if _, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{Name: "a-only", Accounts: []string{keyA}, TokenSha256: sum[:]}); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	cfg := agentConfig(srv, clk, rec, "h1-1-a", keyA)
	cfg.Token, cfg.UsageFlush = scoped, 20*time.Millisecond
	a := run(t, cfg, rec)
	rec.waitFor(t, "on connect", keyA, func(push) bool { return true })
	a.ReportUsage(turn("alice", keyB, 10, 1))
	a.ReportUsage(turn("alice", keyB, 10, 1))
	eventually(t, "the batch refused", func() bool { return a.UsageStats().Refused == 2 })
	a.ReportUsage(turn("alice", keyA, 10, 1))
	eventually(t, "the next batch stored", func() bool { return ledgerTurns(t, admin, "") == 1 })
	if !strings.Contains(rec.text(), "is not one this agent credential may use") {
		t.Errorf("the refusal's reason is not logged:\n%s", rec.text())
	}
}

// preUsageAgents is an AgentService of capability 5: it names no
// capability version in its headers and ends the stream of an agent that
// sends it a message it does not know.
type preUsageAgents struct {
	controlplanev1.UnimplementedAgentServiceServer

	mu  sync.Mutex // guards got
	got []string
}

func (o *preUsageAgents) Connect(st grpc.BidiStreamingServer[controlplanev1.ConnectRequest, controlplanev1.ConnectResponse]) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		o.mu.Lock()
		o.got = append(o.got, fmtType(m.GetMsg()))
		o.mu.Unlock()
		switch m.GetMsg().(type) {
		case *controlplanev1.ConnectRequest_Hello:
			if err := st.Send(&controlplanev1.ConnectResponse{Msg: &controlplanev1.ConnectResponse_Policy{Policy: &controlplanev1.PolicyPush{
				Account: keyA, RatePerMinute: 60, EffectiveRatePerMinute: 60, Burst: 10, IdleTimeoutMs: 120000, TotalTimeoutMs: 600000, MaxRetries: 5, LiveAgents: 1}}}); err != nil {
				return err
			}
		case *controlplanev1.ConnectRequest_Goodbye:
			return nil
		case *controlplanev1.ConnectRequest_Heartbeat, *controlplanev1.ConnectRequest_RateLimits, *controlplanev1.ConnectRequest_Upstream_403:
		default:
			return errors.New("unknown agent message")
		}
	}
}

func fmtType(v any) string {
	switch v.(type) {
	case *controlplanev1.ConnectRequest_Hello:
		return "hello"
	case *controlplanev1.ConnectRequest_Goodbye:
		return "goodbye"
	case *controlplanev1.ConnectRequest_Usage:
		return "usage"
	case *controlplanev1.ConnectRequest_Heartbeat:
		return "heartbeat"
	}
	return "other"
}

// A control plane that does not name capability USAGE in its headers is
// sent no usage report (an older one would end the stream): the usage
// waits.
func TestUsageNotSentToAnOlderControlPlane(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	old := &preUsageAgents{}
	gs := grpc.NewServer()
	controlplanev1.RegisterAgentServiceServer(gs, old)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(ln) }()
	t.Cleanup(func() { gs.Stop(); <-done })

	clk := newFakeClock()
	rec := newRecorder()
	c, err := control.New(control.Config{Target: ln.Addr().String(), Token: tok(t, "agent-token"), AgentID: "h1-1-a", Accounts: []string{keyA},
		Clock: clk.Now, Logger: rec.logger(), UsageFlush: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a := runClient(t, c, rec)
	rec.waitFor(t, "on connect", keyA, func(push) bool { return true })
	c.ReportUsage(turn("alice", keyA, 10, 1))
	time.Sleep(50 * time.Millisecond) // several flushes; the assertion does not depend on it
	a.stop()                          // the goodbye sends what is waiting to a control plane that reads it
	old.mu.Lock()
	got := strings.Join(old.got, ",")
	old.mu.Unlock()
	if strings.Contains(got, "usage") || !strings.HasSuffix(got, "goodbye") {
		t.Errorf("the older control plane received %s; want no usage report, and the goodbye", got)
	}
	if st := c.UsageStats(); st.Rows != 1 {
		t.Errorf("usage stats %+v, want the row still waiting", st)
	}
}

// The plan usage one data plane reports reaches another serving the
// account as the fleet's view (FleetLimits), the newer figures winning.
func TestFleetLimits(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	a := startAgent(t, srv, clk, "h1-1-a", keyA)
	b := startAgent(t, srv, clk, "h2-2-b", keyA)
	a.rec.waitFor(t, "on connect", keyA, func(push) bool { return true })
	b.rec.waitFor(t, "on connect", keyA, func(push) bool { return true })
	if _, ok := b.FleetLimits(keyA); ok {
		t.Fatal("FleetLimits before any report: ok, want none")
	}
	at := clk.Now()
	a.ReportRateLimits(&controlplanev1.RateLimits{Account: keyA, PlanType: "pro", AtUnixMs: at.UnixMilli(),
		Windows: []*controlplanev1.QuotaWindow{{Name: "primary", UsedPercent: 90, WindowMinutes: 300, ResetsAtUnixMs: at.Add(time.Hour).UnixMilli()}}})
	eventually(t, "the fleet's figures at the other data plane", func() bool {
		rl, ok := b.FleetLimits(keyA)
		return ok && rl.GetAtUnixMs() == at.UnixMilli() && rl.GetWindows()[0].GetUsedPercent() == 90
	})
}
