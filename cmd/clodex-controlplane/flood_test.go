package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// rawCodec sends pre-marshaled bytes, so the flood's 300 calls share one
// 4 MB body instead of marshaling 300 copies in the test process.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.([]byte); ok {
		return b, nil
	}
	return proto.Marshal(v.(proto.Message))
}

func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }
func (rawCodec) Name() string                       { return "proto" }

// procBinary is the real clodex-controlplane process.
type procBinary struct {
	cmd    *exec.Cmd
	addr   string
	stderr *syncBuffer
	done   chan struct{} // closed when the process has exited
}

// startBinary builds clodex-controlplane and runs it with args on a
// kernel-chosen loopback port; it is killed when the test ends.
func startBinary(t *testing.T, args []string, env ...string) *procBinary {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "clodex-controlplane")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	p := &procBinary{stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"--listen", "127.0.0.1:0", "--log-format", "json"}, args...)...)
	p.cmd.Env = append(os.Environ(), env...)
	pipe, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	go p.readLog(pipe, addrc)
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill() // fails only when it has already exited
		<-p.done
	})
	select {
	case p.addr = <-addrc:
	case <-time.After(60 * time.Second):
		t.Fatalf("clodex-controlplane did not log its address in 60s:\n%s", p.stderr.String())
	}
	return p
}

// readLog copies the process's log into p.stderr, sends the gRPC address
// from the "serving" line, and waits for the process at end of file.
func (p *procBinary) readLog(pipe interface{ Read([]byte) (int, error) }, addrc chan<- string) {
	sc := bufio.NewScanner(pipe)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		line := sc.Text()
		_, _ = p.stderr.Write([]byte(line + "\n"))
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if !sent && json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "serving" && rec.Addr != "" {
			addrc <- rec.Addr
			sent = true
		}
	}
	_ = p.cmd.Wait() // killed by the test's cleanup
	close(p.done)
}

// memKB reads a field (VmRSS, VmHWM) of /proc/PID/status in KiB.
func memKB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read the process status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatalf("parse %s %q: %v", field, line, err)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// An attacker cannot make the control plane allocate: 300 concurrent
// Admit calls with a wrong token and a 4 MB body each, over 30
// connections, then 300 more with the agent token, leave the real
// process's peak RSS under 100 MB, and every call is refused with
// Unauthenticated (the token is checked before the body is read) or
// ResourceExhausted (the body is over the size limit, refused from its
// length prefix).
func TestFloodBigBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and floods it")
	}
	p := startBinary(t, []string{"--data-dir", t.TempDir()},
		"CLODEX_ADMIN_TOKEN=flood-admin-token", "CLODEX_AGENT_TOKEN=flood-agent-token")
	pid := p.cmd.Process.Pid
	before := memKB(t, pid, "VmRSS")

	// Just under gRPC's 4 MiB default receive limit, so a server that
	// reads before it authenticates must allocate all of it.
	body, err := proto.Marshal(&controlplanev1.AdmitRequest{Account: strings.Repeat("a", 4<<20-16)})
	if err != nil {
		t.Fatal(err)
	}
	// A caller with a wrong token is refused from its headers; one with
	// the agent token is refused from the message's length prefix.
	for _, tok := range []string{"not-the-agent-token", "flood-agent-token"} {
		codesSeen, other := flood(t, p.addr, tok, controlplanev1.AdmissionService_Admit_FullMethodName, body, 30, 10, refusedOnly)
		peak, rss := memKB(t, pid, "VmHWM"), memKB(t, pid, "VmRSS")
		t.Logf("token %s: clodex-controlplane RSS %d KiB before the floods, peak (VmHWM) %d KiB, %d KiB now; codes %v", tok, before, peak, rss, codesSeen)
		if len(other) > 0 {
			t.Errorf("token %s: %d of 300 calls got something else than Unauthenticated or ResourceExhausted, first: %s", tok, len(other), other[0])
		}
		if limit := 100 << 10; peak >= limit {
			t.Errorf("token %s: peak RSS under the flood = %d KiB, want under %d KiB (100 MB)", tok, peak, limit)
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// A caller with a valid agent token sending the largest messages the
// server reads, 600 at a time, keeps the real process's RSS at most
// 150 MB, and the control plane answers health checks and admin calls
// throughout: 600 concurrent Admits of just under the server's receive
// limit (read, then refused by the method's own limit before they are
// decoded), then 600 concurrent ReportGrants of the largest legitimate
// size (200 accounts with 128-byte keys, decoded and answered). The
// peak RSS and the probes' slowest answer are printed (the probes'
// deadline only tells a server that stopped answering from a slow one).
func TestFloodValidTokenMaximalMessages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and floods it")
	}
	p := startBinary(t, []string{"--data-dir", t.TempDir()},
		"CLODEX_ADMIN_TOKEN=flood-admin-token", "CLODEX_AGENT_TOKEN=flood-agent-token")
	pid := p.cmd.Process.Pid
	before := memKB(t, pid, "VmRSS")

	admit, err := proto.Marshal(&controlplanev1.AdmitRequest{Account: strings.Repeat("a", controlplane.MaxRecvMsgSize-8)})
	if err != nil {
		t.Fatal(err)
	}
	grants := make([]*controlplanev1.LocalGrants, 200)
	for i := range grants {
		k := fmt.Sprintf("acct_%04d_", i)
		grants[i] = &controlplanev1.LocalGrants{Account: k + strings.Repeat("f", 128-len(k)), Count: 100000, FirstUnixMs: -1, LastUnixMs: -1}
	}
	report, err := proto.Marshal(&controlplanev1.ReportGrantsRequest{ReportId: strings.Repeat("r", 128), AgentId: strings.Repeat("i", 128), Grants: grants})
	if err != nil {
		t.Fatal(err)
	}
	if len(admit) > controlplane.MaxRecvMsgSize || len(report) > controlplane.MaxRecvMsgSize {
		t.Fatalf("messages of %d and %d bytes; the flood wants the largest the server reads (%d)", len(admit), len(report), controlplane.MaxRecvMsgSize)
	}

	probes := startProbes(t, p.addr, "flood-admin-token")
	rounds := []struct {
		name, method string
		body         []byte
		ok           func(*status.Status) bool
	}{
		{"Admit", controlplanev1.AdmissionService_Admit_FullMethodName, admit, func(st *status.Status) bool {
			return st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "this method accepts at most 1024")
		}},
		{"ReportGrants", controlplanev1.AdmissionService_ReportGrants_FullMethodName, report, func(st *status.Status) bool {
			return st.Code() == codes.OK
		}},
	}
	for _, r := range rounds {
		codesSeen, other := flood(t, p.addr, "flood-agent-token", r.method, r.body, 30, 20, r.ok)
		t.Logf("%d concurrent %s of %d bytes: codes %v; RSS peak (VmHWM) %d KiB, now %d KiB (%d KiB before)",
			600, r.name, len(r.body), codesSeen, memKB(t, pid, "VmHWM"), memKB(t, pid, "VmRSS"), before)
		if len(other) > 0 {
			t.Errorf("%s: %d of 600 calls got an unexpected answer, first: %s", r.name, len(other), other[0])
		}
	}
	answered, slowest, failures := probes.stop()
	peak := memKB(t, pid, "VmHWM")
	t.Logf("clodex-controlplane peak RSS %d KiB (%.1f MB); %d health and admin probes answered during the floods, the slowest in %v",
		peak, float64(peak)/1024, answered, slowest)
	if limit := 150 * 1000 * 1000 / 1024; peak > limit {
		t.Errorf("peak RSS under the flood = %d KiB, want at most %d KiB (150 MB)", peak, limit)
	}
	if len(failures) > 0 || answered == 0 {
		t.Errorf("probes during the flood: %d answered, %d failed, first failure: %v", answered, len(failures), failures)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// probes asks the health service (without a token) and an admin RPC
// (ListAccounts) in turn, one at a time, until stop.
type probes struct {
	cancel   context.CancelFunc
	done     chan struct{}
	answered int
	slowest  time.Duration
	failures []string
}

// probeDeadline bounds one probe: a server that does not answer within
// it has stopped answering, not merely slowed down.
const probeDeadline = 30 * time.Second

func startProbes(t *testing.T, addr, adminToken string) *probes {
	t.Helper()
	health := dialRaw(t, addr, "")
	admin := dialRaw(t, addr, adminToken)
	ctx, cancel := context.WithCancel(t.Context())
	p := &probes{cancel: cancel, done: make(chan struct{})}
	go p.run(ctx, healthpb.NewHealthClient(health), controlplanev1.NewAdminServiceClient(admin))
	return p
}

func (p *probes) run(ctx context.Context, health healthpb.HealthClient, admin controlplanev1.AdminServiceClient) {
	defer close(p.done)
	for i := 0; ctx.Err() == nil; i++ {
		pctx, cancel := context.WithTimeout(ctx, probeDeadline)
		start := time.Now()
		var err error
		if i%2 == 0 {
			var resp *healthpb.HealthCheckResponse
			resp, err = health.Check(pctx, &healthpb.HealthCheckRequest{})
			if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				err = fmt.Errorf("health %v, want SERVING", resp.GetStatus())
			}
		} else {
			_, err = admin.ListAccounts(pctx, &controlplanev1.ListAccountsRequest{})
		}
		took := time.Since(start)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			p.failures = append(p.failures, err.Error())
		default:
			p.answered++
			p.slowest = max(p.slowest, took)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the probes and returns how many were answered, the slowest
// answer and the failures.
func (p *probes) stop() (int, time.Duration, []string) {
	p.cancel()
	<-p.done
	return p.answered, p.slowest, p.failures
}

// dialRaw is a connection that sends token (none when "").
func dialRaw(t *testing.T, addr, token string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if token != "" {
		tok, err := bearer.Parse(token)
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer.Credentials(tok)))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// refusedOnly accepts Unauthenticated with the server's message, and
// ResourceExhausted.
func refusedOnly(st *status.Status) bool {
	switch st.Code() {
	case codes.Unauthenticated:
		return st.Message() == "missing or invalid bearer token; send authorization: Bearer <agent or admin token>"
	case codes.ResourceExhausted:
		return true
	}
	return false
}

// flood sends conns*perConn concurrent calls of method with body over
// conns connections and returns the codes seen and the answers ok did
// not accept.
func flood(t *testing.T, addr, token, method string, body []byte, conns, perConn int, ok func(*status.Status) bool) (map[codes.Code]int, []string) {
	t.Helper()
	ccs := make([]*grpc.ClientConn, conns)
	for i := range ccs {
		tok, err := bearer.Parse(token)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(bearer.Credentials(tok)), grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cc.Close() }()
		ccs[i] = cc
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codesSeen := map[codes.Code]int{}
	var other []string
	for _, cc := range ccs {
		for range perConn {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				var resp emptypb.Empty // the answers are not read: any message decodes into it
				err := cc.Invoke(ctx, method, body, &resp)
				st := status.Convert(err)
				mu.Lock()
				defer mu.Unlock()
				codesSeen[st.Code()]++
				if !ok(st) {
					other = append(other, st.Code().String()+": "+st.Message())
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	return codesSeen, other
}

// The process honours GOMEMLIMIT, collects at defaultGOGC under it, and
// says so in its log.
func TestProcessHonoursGOMEMLIMIT(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	p := startBinary(t, []string{"--data-dir", t.TempDir()},
		"CLODEX_ADMIN_TOKEN=mem-admin-token", "CLODEX_AGENT_TOKEN=mem-agent-token", "GOMEMLIMIT=200MiB")
	want := `"msg":"memory limit","from":"GOMEMLIMIT","gogc":400,"limit_bytes":209715200`
	if !strings.Contains(p.stderr.String(), want) {
		t.Errorf("log:\n%s\nwant a line containing %s", p.stderr.String(), want)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}
