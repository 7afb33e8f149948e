package control_test

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/pacing"
)

// silentLink is a TCP relay in front of a replica that can go silent: from
// then on it forwards nothing in either direction and keeps every
// connection open, as a stopped process or a network that drops packets
// does. No RST, no FIN: only a ping can tell.
type silentLink struct {
	lis    net.Listener
	to     string
	silent atomic.Bool
	wg     sync.WaitGroup
	mu     sync.Mutex // guards conns
	conns  []net.Conn
}

func startSilentLink(t *testing.T, to string) *silentLink {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &silentLink{lis: lis, to: to}
	l.wg.Go(l.accept)
	t.Cleanup(func() {
		_ = lis.Close()
		l.mu.Lock()
		for _, c := range l.conns {
			_ = c.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
	})
	return l
}

func (l *silentLink) Addr() string { return l.lis.Addr().String() }

func (l *silentLink) accept() {
	for {
		c, err := l.lis.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", l.to)
		if err != nil {
			_ = c.Close()
			continue
		}
		l.mu.Lock()
		l.conns = append(l.conns, c, up)
		l.mu.Unlock()
		l.wg.Go(func() { l.pipe(up, c) })
		l.wg.Go(func() { l.pipe(c, up) })
	}
}

// pipe copies src to dst until src ends, dropping what it reads while
// the link is silent.
func (l *silentLink) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !l.silent.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF, or the link closed
			return
		}
	}
}

// TestHungReplicaLeavesTheBalancer: of two replicas, one goes silent (its
// connection stays open and its health stream says nothing). The data
// plane's keepalive notices within KeepaliveTime + KeepaliveTimeout and
// the balancer drops it: from then on every Admit is decided centrally by
// the survivor, with no more deadlines spent on the silent one. Without
// keepalive, round robin keeps sending it every other request forever and
// no run of central decisions ever forms.
func TestHungReplicaLeavesTheBalancer(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the keepalive (about 13 s); skipped with -short")
	}
	off := pacing.DefaultPolicy()
	off.RatePerMinute = 0 // every central decision admits: the test is about routing
	a := controlplanetest.Start(t, &controlplanetest.Options{Defaults: &off})
	b := controlplanetest.Start(t, &controlplanetest.Options{Defaults: &off, Tokens: a})
	a.Register(keyA)
	b.Register(keyA)
	link := startSilentLink(t, a.Addr)
	var notes noticeLog
	c, err := control.New(control.Config{Target: replicas(&controlplanetest.Server{Addr: link.Addr()}, b), Token: a.AgentToken,
		AgentID: "h-1-hung", Timeout: time.Second, Notify: notes.Notify})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()

	// Both replicas decide before the link goes silent.
	for i := 0; ; i++ {
		if i == 100 {
			t.Fatal("the balancer never used both replicas")
		}
		if err := c.Admit(ctx, keyA); err != nil {
			t.Fatal(err)
		}
		_, errA := a.Store().Account(ctx, keyA, time.Now())
		_, errB := b.Store().Account(ctx, keyA, time.Now())
		if errA == nil && errB == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	link.silent.Store(true)
	silentAt := time.Now()
	// Bound, not an assertion of speed: the keepalive needs about 13 s.
	const want = 20
	deadline := silentAt.Add(control.KeepaliveTime + control.KeepaliveTimeout + 30*time.Second)
	run := 0
	for run < want {
		if time.Now().After(deadline) {
			t.Fatalf("%v after replica A went silent, Admit still did not get %d central decisions in a row (stats %+v): the silent replica was never dropped",
				time.Since(silentAt).Round(time.Second), want, c.Stats())
		}
		before := c.Stats()
		if err := c.Admit(ctx, keyA); err != nil {
			t.Fatal(err)
		}
		after := c.Stats()
		if after.Central.Admits == before.Central.Admits+1 && after.Local == before.Local && after.Errors == before.Errors {
			run++
		} else {
			run = 0
			time.Sleep(100 * time.Millisecond)
		}
	}
	if got := c.Mode(); got != control.ModeCentral {
		t.Errorf("Mode() = %q, want %q", got, control.ModeCentral)
	}
	t.Logf("%d central decisions in a row %v after replica A went silent", want, time.Since(silentAt).Round(100*time.Millisecond))
}
