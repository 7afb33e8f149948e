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
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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
		codesSeen, other := flood(t, p.addr, tok, body, 30, 10)
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

// flood sends conns*perConn concurrent Admit calls with body over conns
// connections and returns the codes seen and the unexpected answers.
func flood(t *testing.T, addr, token string, body []byte, conns, perConn int) (map[codes.Code]int, []string) {
	t.Helper()
	tok, err := bearer.Parse(token)
	if err != nil {
		t.Fatal(err)
	}
	ccs := make([]*grpc.ClientConn, conns)
	for i := range ccs {
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
				var resp controlplanev1.AdmitResponse
				err := cc.Invoke(ctx, controlplanev1.AdmissionService_Admit_FullMethodName, body, &resp)
				st := status.Convert(err)
				mu.Lock()
				defer mu.Unlock()
				codesSeen[st.Code()]++
				switch {
				case st.Code() == codes.Unauthenticated && st.Message() != "missing or invalid bearer token; send authorization: Bearer <agent or admin token>":
					other = append(other, "Unauthenticated with message "+st.Message())
				case st.Code() != codes.Unauthenticated && st.Code() != codes.ResourceExhausted:
					other = append(other, st.Code().String()+": "+st.Message())
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	return codesSeen, other
}
