package controlplane_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// logBuffer is a bytes.Buffer safe for the server's concurrent logging.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// deniedLine is one "rpc denied" log line.
type deniedLine struct {
	Denied  int    `json:"denied"`
	From    string `json:"from"`
	Reasons string `json:"reasons"`
	Method  string `json:"method"`
	Peer    string `json:"peer"`
}

func (b *logBuffer) denied(t *testing.T) []deniedLine {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []deniedLine
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for sc.Scan() {
		var rec struct {
			Msg string `json:"msg"`
			deniedLine
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, sc.Bytes())
		}
		if rec.Msg == "rpc denied" {
			out = append(out, rec.deniedLine)
		}
	}
	return out
}

// dialFrom dials srv from the loopback address ip (any of 127.0.0.0/8),
// so one test can be many callers.
func dialFrom(t *testing.T, srv *controlplanetest.Server, ip string, tok bearer.Token) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	cc, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearer.Credentials(tok)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// waitDenied waits (a generous bound) until the log has n "rpc denied" lines.
func waitDenied(t *testing.T, logs *logBuffer, n int) []deniedLine {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := logs.denied(t)
		if len(got) >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A wrong-token flood over a real listener is counted per reason and
// address, and logged: the first denial at once, then one line per minute
// (of the injected clock) saying how many were denied, why and from where,
// also when the flood has stopped. Addresses past MaxDeniedPeers share
// the "other" label.
func TestDenialsCountedAndLogged(t *testing.T) {
	clk := newClock()
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	srv := controlplanetest.Start(t, &controlplanetest.Options{
		Now: clk.Now, Registerer: reg, FleetTick: 5 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	wrong := mustToken(t, "not-the-token")

	const flood = 3000
	var wg sync.WaitGroup
	for w := range 8 {
		cc := dialFrom(t, srv, "127.0.0.1", wrong)
		wg.Go(func() {
			client := controlplanev1.NewAdmissionServiceClient(cc)
			for i := w; i < flood; i += 8 {
				if _, err := client.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key}); status.Code(err) != codes.Unauthenticated {
					t.Errorf("Admit with a wrong token = %v, want Unauthenticated", err)
					return
				}
			}
		})
	}
	wg.Wait()
	lines := logs.denied(t)
	if len(lines) != 1 || lines[0].Denied != 1 || lines[0].From != "127.0.0.1=1" || lines[0].Reasons != "unauthenticated=1" ||
		lines[0].Method != controlplanev1.AdmissionService_Admit_FullMethodName {
		t.Fatalf("log after the flood's first minute = %+v, want one line for the first denial", lines)
	}
	if got := gather(t, reg)[`clodex_controlplane_denied_total{peer="127.0.0.1",reason="unauthenticated"}`]; got != flood {
		t.Errorf("denied_total{127.0.0.1, unauthenticated} = %v, want %d", got, flood)
	}

	// A minute later, with the flood over, the fleet loop logs the rest.
	clk.Advance(controlplane.DeniedLogInterval)
	lines = waitDenied(t, logs, 2)
	if len(lines) != 2 || lines[1].Denied != flood-1 || lines[1].From != fmt.Sprintf("127.0.0.1=%d", flood-1) ||
		lines[1].Reasons != fmt.Sprintf("unauthenticated=%d", flood-1) {
		t.Fatalf("log a minute later = %+v, want a second line for %d denials from 127.0.0.1", lines, flood-1)
	}

	// The agent token on an admin RPC is a denial too.
	admin := controlplanev1.NewAdminServiceClient(dialFrom(t, srv, "127.0.0.1", srv.AgentToken))
	if _, err := admin.ListAccounts(t.Context(), &controlplanev1.ListAccountsRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("ListAccounts with the agent token = %v, want PermissionDenied", err)
	}

	// 105 more addresses: 99 get their own label (127.0.0.1 has one), 6
	// share "other"; the log names the 10 busiest and sums the others.
	for i := 2; i <= 106; i++ {
		client := controlplanev1.NewAdmissionServiceClient(dialFrom(t, srv, fmt.Sprintf("127.0.0.%d", i), wrong))
		if _, err := client.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("Admit from 127.0.0.%d = %v, want Unauthenticated", i, err)
		}
	}
	got := gather(t, reg)
	peers := map[string]bool{}
	for name := range got {
		if rest, ok := strings.CutPrefix(name, `clodex_controlplane_denied_total{peer="`); ok {
			peers[rest[:strings.Index(rest, `"`)]] = true
		}
	}
	if len(peers) != controlplane.MaxDeniedPeers+1 || !peers["other"] {
		t.Errorf("denied_total has %d peer labels (other: %v), want %d and other", len(peers), peers["other"], controlplane.MaxDeniedPeers+1)
	}
	if v := got[`clodex_controlplane_denied_total{peer="other",reason="unauthenticated"}`]; v != 6 {
		t.Errorf(`denied_total{other, unauthenticated} = %v, want 6`, v)
	}
	if v := got[`clodex_controlplane_denied_total{peer="127.0.0.1",reason="permission_denied"}`]; v != 1 {
		t.Errorf(`denied_total{127.0.0.1, permission_denied} = %v, want 1`, v)
	}
	clk.Advance(controlplane.DeniedLogInterval)
	lines = waitDenied(t, logs, 3)
	if len(lines) != 3 {
		t.Fatalf("log = %+v, want a third line a minute later", lines)
	}
	l := lines[2]
	if l.Denied != 106 || l.Reasons != "permission_denied=1,unauthenticated=105" || strings.Count(l.From, "=") != 11 ||
		!strings.HasPrefix(l.From, "127.0.0.1=1,127.0.0.10=1,") || !strings.HasSuffix(l.From, ",others=96") {
		t.Errorf("third line = %+v, want 106 denials, 10 addresses named and others=96", l)
	}
}
