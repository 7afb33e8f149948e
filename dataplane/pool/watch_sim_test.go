package pool

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/codexsim"
)

// diagLog is a Config.Diagnostics writer the test can wait on.
type diagLog struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	wrote chan struct{}
}

func newDiagLog() *diagLog { return &diagLog{wrote: make(chan struct{}, 1)} }

func (d *diagLog) Write(p []byte) (int, error) {
	d.mu.Lock()
	n, err := d.buf.Write(p)
	d.mu.Unlock()
	select {
	case d.wrote <- struct{}{}:
	default:
	}
	return n, err
}

// wait waits, event-driven, until n records of event were written; the
// deadline only turns a hang into a failure.
func (d *diagLog) wait(t *testing.T, event string, n int) []map[string]any {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		d.mu.Lock()
		var got []map[string]any
		for line := range strings.SplitSeq(strings.TrimSpace(d.buf.String()), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["event"] == event {
				got = append(got, m)
			}
		}
		d.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-d.wrote:
		case <-deadline.C:
			t.Fatalf("%d %s records after 30 s, want %d", len(got), event, n)
		}
	}
}

// countDials makes the pool's HTTP client count dial attempts.
func countDials(n *atomic.Int64) func(*Config) {
	return func(c *Config) {
		tr := &http.Transport{DisableKeepAlives: true}
		c.Upstream.HTTPClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			n.Add(1)
			return tr.RoundTrip(r)
		})}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestSimIdleSocketClosedByTheBackend(t *testing.T) {
	tests := []struct {
		name      string
		req       codexsim.CloseIdleRequest
		reason    string
		closeCode float64
	}{
		{"close frame", codexsim.CloseIdleRequest{Account: simAccount, Code: 4000, Reason: "idle"}, EvictPeerClosed, 4000},
		{"no close frame", codexsim.CloseIdleRequest{Account: simAccount, Drop: true}, EvictConnectionLost, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var dials atomic.Int64
			diag := newDiagLog()
			e := newSimEnv(t, codexsim.Config{}, func(c *Config) {
				c.Diagnostics = diag
				countDials(&dials)(c)
			})
			pt := simPart("idle-close-" + tt.name)
			in := items(user("#sim reply one"))
			r, err := e.turn(t.Context(), pt, in)
			if err != nil {
				t.Fatal(err)
			}

			closed, err := e.sim.CloseIdle(tt.req)
			if err != nil || closed != 1 {
				t.Fatalf("CloseIdle = %d, %v; want 1 socket closed", closed, err)
			}
			start := time.Now()
			lost := diag.wait(t, "ws_head_lost", 1)[0]
			t.Logf("head dropped %v after the emulator's close returned", time.Since(start))
			if lost["reason"] != tt.reason || lost["connectionId"] != 1.0 {
				t.Errorf("ws_head_lost = %v, want reason %s for connection 1", lost, tt.reason)
			}
			if got, _ := lost["closeCode"].(float64); got != tt.closeCode {
				t.Errorf("closeCode = %v, want %v", got, tt.closeCode)
			}
			if s := e.pool.Stats(); s.Evictions[tt.reason] != 1 || s.Nursery+s.Established != 0 {
				t.Errorf("pool evictions %v, heads %d; want one %s and none left", s.Evictions, s.Nursery+s.Established, tt.reason)
			}

			// The next turn dials exactly once and nothing fails.
			in = cat(in, r.output, items(user("#sim reply two")))
			r, err = e.turn(t.Context(), pt, in)
			if err != nil {
				t.Fatal(err)
			}
			if r.first.Decision != DecisionNewPartition || r.replaced != "" || r.lease.Delta != 0 {
				t.Errorf("next turn: %s, replaced %q, delta %d; want new_partition_head with full context and no replacement",
					r.first.Decision, r.replaced, r.lease.Delta)
			}
			s := e.pool.Stats()
			if dials.Load() != 2 || s.Replacements != 0 || s.NewSockets != 2 {
				t.Errorf("dial attempts %d, replacements %d, new sockets %d; want 2, 0, 2", dials.Load(), s.Replacements, s.NewSockets)
			}
			st := e.sim.Stats()
			if st.Upgrades != 2 || st.CompletedResponses != 2 || st.IdleSocketsClosed != 1 || len(st.Errors) != 0 || st.PreviousResponseNotFound != 0 {
				t.Errorf("emulator upgrades=%d completed=%d idle_sockets_closed=%d errors=%v not_found=%d; want 2, 2, 1, none, 0",
					st.Upgrades, st.CompletedResponses, st.IdleSocketsClosed, st.Errors, st.PreviousResponseNotFound)
			}
		})
	}
}

// freezer is a TCP proxy between the pool and the emulator. freeze makes
// every connection it carries stop forwarding in both directions without
// closing, as a NAT that forgot the flow or a hung middlebox does; later
// connections forward normally. clientGone receives once per connection
// whose pool side was closed.
type freezer struct {
	ln         net.Listener
	clientGone chan struct{}
	wg         sync.WaitGroup

	mu     sync.Mutex // guards the following fields
	target string
	conns  []*proxied
	closed bool
}

type proxied struct {
	client, server net.Conn
	frozen         atomic.Bool
}

func newFreezer(t *testing.T) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, clientGone: make(chan struct{}, 16)}
	f.wg.Go(f.acceptLoop)
	t.Cleanup(f.close)
	return f
}

func (f *freezer) addr() string { return f.ln.Addr().String() }

// setTarget sets the host:port connections are forwarded to.
func (f *freezer) setTarget(addr string) {
	f.mu.Lock()
	f.target = addr
	f.mu.Unlock()
}

func (f *freezer) acceptLoop() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		target := f.target
		f.mu.Unlock()
		s, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		pc := &proxied{client: c, server: s}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		f.conns = append(f.conns, pc)
		f.mu.Unlock()
		f.wg.Go(func() {
			pc.copy(pc.server, pc.client)
			f.clientGone <- struct{}{} // the pool closed its end
		})
		f.wg.Go(func() { pc.copy(pc.client, pc.server) })
	}
}

// copy forwards src to dst until src fails; frozen bytes are dropped.
func (pc *proxied) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !pc.frozen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, pc := range f.conns {
		pc.frozen.Store(true)
	}
}

func (f *freezer) close() {
	f.mu.Lock()
	f.closed = true
	conns := f.conns
	f.mu.Unlock()
	f.ln.Close()
	for _, pc := range conns {
		pc.client.Close()
		pc.server.Close()
	}
	f.wg.Wait()
}

func TestSimDeadTCPDroppedByKeepalive(t *testing.T) {
	var dials atomic.Int64
	diag := newDiagLog()
	var proxy *freezer
	e := newSimEnv(t, codexsim.Config{}, func(c *Config) {
		// Made here so that it closes before the emulator, which would
		// otherwise wait out its close handshake on the frozen socket.
		proxy = newFreezer(t)
		c.Diagnostics = diag
		// Short enough for a test. The head is frozen before its first
		// ping, so what fires is the pong's deadline, never a slow pong.
		c.KeepaliveInterval = 50 * time.Millisecond
		c.KeepaliveTimeout = time.Second
		c.Upstream = simUpstream(proxy.addr())
		countDials(&dials)(c)
	})
	proxy.setTarget(e.addr)
	pt := simPart("dead-tcp")
	in := items(user("#sim reply one"))
	r, err := e.turn(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	proxy.freeze()

	lost := diag.wait(t, "ws_head_lost", 1)[0]
	if lost["reason"] != EvictKeepaliveTimeout || lost["connectionId"] != 1.0 {
		t.Errorf("ws_head_lost = %v, want keepalive_timeout for connection 1", lost)
	}
	select {
	case <-proxy.clientGone: // the pool released its socket
	case <-time.After(30 * time.Second):
		t.Fatal("the pool did not close the dead socket within 30 s")
	}
	if s := e.pool.Stats(); s.Evictions[EvictKeepaliveTimeout] != 1 || s.Nursery+s.Established != 0 {
		t.Errorf("pool evictions %v, heads %d; want one keepalive_timeout and none left", s.Evictions, s.Nursery+s.Established)
	}

	in = cat(in, r.output, items(user("#sim reply two")))
	r, err = e.turn(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	if r.first.Decision != DecisionNewPartition || r.replaced != "" {
		t.Errorf("next turn: %s, replaced %q; want new_partition_head and no replacement", r.first.Decision, r.replaced)
	}
	if s := e.pool.Stats(); dials.Load() != 2 || s.Replacements != 0 {
		t.Errorf("dial attempts %d, replacements %d; want 2 and 0", dials.Load(), s.Replacements)
	}
	if st := e.sim.Stats(); st.Upgrades != 2 || st.CompletedResponses != 2 || len(st.Errors) != 0 {
		t.Errorf("emulator upgrades=%d completed=%d errors=%v; want 2, 2, none", st.Upgrades, st.CompletedResponses, st.Errors)
	}
}
