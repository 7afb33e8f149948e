package upstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/upstream/upstreamtest"
)

// dialPeer dials srv and returns the Conn and the server's side of it.
func dialPeer(t *testing.T, srv *upstreamtest.Server, opts DialOptions) (*Conn, *upstreamtest.Peer) {
	t.Helper()
	opts.URL, opts.HTTPClient, opts.Credential = srv.URL, srv.Client(), testCred
	c, err := Dial(t.Context(), opts)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p, err := srv.Accept(ctx)
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	return c, p
}

// wait receives from ch; the deadline only turns a hang into a failure.
func wait[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s within 30 s", what)
		var zero T
		return zero
	}
}

func send(t *testing.T, p *upstreamtest.Peer, frame string) {
	t.Helper()
	if err := p.Send(t.Context(), []byte(frame)); err != nil {
		t.Fatalf("peer Send: %v", err)
	}
}

// Frames hands every text frame over in order; it is closed when the
// socket ends, and Err says how.
func TestFramesAndErr(t *testing.T) {
	srv := upstreamtest.NewServer(t)
	c, p := dialPeer(t, srv, DialOptions{})
	for i := range 3 {
		send(t, p, fmt.Sprintf(`{"type":"e","i":%d}`, i))
	}
	for i := range 3 {
		got := wait(t, "frame", c.Frames())
		if want := fmt.Sprintf(`{"type":"e","i":%d}`, i); string(got) != want {
			t.Fatalf("frame %d = %q, want %q", i, got, want)
		}
	}
	if err := c.Err(); err != nil {
		t.Errorf("Err on a live socket = %v, want nil", err)
	}
	if err := p.Close(websocket.StatusGoingAway, "socket lifetime reached"); err != nil {
		t.Fatalf("peer Close: %v", err)
	}
	select {
	case f, ok := <-c.Frames():
		if ok {
			t.Fatalf("frame %q after the peer's close, want Frames closed", f)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Frames still open 30 s after the peer's close")
	}
	if got := CloseStatus(c.Err()); got != websocket.StatusGoingAway {
		t.Errorf("CloseStatus(Err) = %v (%v), want 1001", got, c.Err())
	}
	if _, err := c.Next(t.Context()); CloseStatus(err) != websocket.StatusGoingAway {
		t.Errorf("Next after the end = %v, want the peer's close", err)
	}
	if c.Claim() {
		t.Error("Claim on an ended socket = true, want false")
	}
}

// A binary frame ends the socket for the consumer with ErrBinaryFrame.
func TestBinaryFrameEndsTheReader(t *testing.T) {
	srv := upstreamtest.NewServer(t)
	c, p := dialPeer(t, srv, DialOptions{})
	if err := p.SendBinary(t.Context(), []byte{1, 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Next(t.Context()); !errors.Is(err, ErrBinaryFrame) {
		t.Errorf("Next = %v, want ErrBinaryFrame", err)
	}
}

// OnFrame sees every text frame the reader reads, before the consumer
// does, whether it is delivered or goes to a watch.
func TestOnFrameSeesEveryTextFrame(t *testing.T) {
	srv := upstreamtest.NewServer(t)
	var mu sync.Mutex
	var seen []string
	c, p := dialPeer(t, srv, DialOptions{OnFrame: func(frame []byte) {
		mu.Lock()
		seen = append(seen, string(frame))
		mu.Unlock()
	}})
	seenNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
	send(t, p, `{"type":"codex.rate_limits"}`)
	send(t, p, `{"type":"response.created"}`)
	for _, want := range []string{`{"type":"codex.rate_limits"}`, `{"type":"response.created"}`} {
		got, err := c.Next(t.Context())
		if err != nil || string(got) != want {
			t.Fatalf("Next = %q, %v; want %s", got, err, want)
		}
		if s := seenNow(); !slices.Contains(s, want) {
			t.Fatalf("OnFrame saw %q when Next returned %s; want it seen first", s, want)
		}
	}
	lost := make(chan error, 1)
	c.Watch(func(err error) { lost <- err })
	send(t, p, `{"type":"error"}`)
	if err := wait(t, "lost", lost); err == nil {
		t.Fatal("lost(nil), want the unexpected frame")
	}
	if s := seenNow(); !slices.Equal(s, []string{`{"type":"codex.rate_limits"}`, `{"type":"response.created"}`, `{"type":"error"}`}) {
		t.Errorf("OnFrame saw %q; want every frame, the watched one included", s)
	}
}

// A watched socket gives the first thing it reads to lost, on the reader
// after it stopped reading (lost may close the Conn), and Claim then
// reports it dead.
func TestWatch(t *testing.T) {
	tests := []struct {
		name  string
		peer  func(t *testing.T, p *upstreamtest.Peer)
		check func(t *testing.T, err error)
	}{
		{"a data frame", func(t *testing.T, p *upstreamtest.Peer) { send(t, p, `{"type":"error","n":1}`) },
			func(t *testing.T, err error) {
				var ue *UnexpectedFrameError
				if !errors.As(err, &ue) || string(ue.Frame) != `{"type":"error","n":1}` {
					t.Errorf("lost(%v), want an UnexpectedFrameError with the frame", err)
				}
			}},
		{"a close frame", func(t *testing.T, p *upstreamtest.Peer) { _ = p.Close(4000, "idle") },
			func(t *testing.T, err error) {
				if CloseStatus(err) != 4000 {
					t.Errorf("lost(%v), want the peer's close 4000", err)
				}
			}},
		{"a dropped connection", func(t *testing.T, p *upstreamtest.Peer) { p.Drop() },
			func(t *testing.T, err error) {
				var ue *UnexpectedFrameError
				if err == nil || CloseStatus(err) != -1 || errors.As(err, &ue) {
					t.Errorf("lost(%v), want a read error without a close frame", err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := upstreamtest.NewServer(t)
			c, p := dialPeer(t, srv, DialOptions{})
			lost := make(chan error, 1)
			c.Watch(func(err error) {
				_ = c.CloseNow() // allowed: the reader stopped reading
				lost <- err
			})
			tt.peer(t, p)
			tt.check(t, wait(t, "lost", lost))
			if c.Claim() {
				t.Error("Claim after the watch fired = true, want false")
			}
			wait(t, "the peer to see the client go", p.Gone())
		})
	}
}

// What the reader read while the socket was claimed and nobody took goes
// to the next watch: a frame that arrived after a response completed, or
// the socket's end.
func TestWatchGetsWhatNobodyTook(t *testing.T) {
	t.Run("a frame", func(t *testing.T) {
		srv := upstreamtest.NewServer(t)
		read := make(chan struct{}, 1)
		c, p := dialPeer(t, srv, DialOptions{OnFrame: func([]byte) { read <- struct{}{} }})
		send(t, p, `{"type":"late"}`)
		wait(t, "the reader to read the frame", read) // it now holds it: nobody takes it
		lost := make(chan error, 1)
		c.Watch(func(err error) { lost <- err })
		var ue *UnexpectedFrameError
		if err := wait(t, "lost", lost); !errors.As(err, &ue) || string(ue.Frame) != `{"type":"late"}` {
			t.Errorf("lost(%v), want the frame nobody took", err)
		}
	})
	t.Run("the end", func(t *testing.T) {
		srv := upstreamtest.NewServer(t)
		c, p := dialPeer(t, srv, DialOptions{})
		_ = p.Close(websocket.StatusNormalClosure, "bye")
		<-c.Frames() // closed: the reader stopped
		lost := make(chan error, 1)
		c.Watch(func(err error) { lost <- err })
		if err := wait(t, "lost", lost); CloseStatus(err) != websocket.StatusNormalClosure {
			t.Errorf("lost(%v), want the close nobody took", err)
		}
	})
}

// Claim ends a watch: what arrives after goes to the consumer, and the
// watch's lost is never called.
func TestClaimEndsTheWatch(t *testing.T) {
	srv := upstreamtest.NewServer(t)
	c, p := dialPeer(t, srv, DialOptions{})
	called := make(chan error, 1)
	c.Watch(func(err error) { called <- err })
	if err := c.Ping(t.Context()); err != nil { // the watched socket is read: pongs arrive
		t.Fatalf("Ping while watched: %v", err)
	}
	if !c.Claim() {
		t.Fatal("Claim on a live watched socket = false")
	}
	send(t, p, `{"type":"response.created"}`)
	if got, err := c.Next(t.Context()); err != nil || string(got) != `{"type":"response.created"}` {
		t.Fatalf("Next after Claim = %q, %v; want the frame", got, err)
	}
	select {
	case err := <-called:
		t.Errorf("lost(%v) after Claim, want it never called", err)
	default:
	}
}

// TestWatchClaimRace races a peer's frame against Claim many times: the
// frame goes to lost (and Claim reports the socket dead) or to the
// consumer (and lost is never called), never both, never neither. Run it
// with -race.
func TestWatchClaimRace(t *testing.T) {
	srv := upstreamtest.NewServer(t)
	c, p := dialPeer(t, srv, DialOptions{})
	toLost, toConsumer := 0, 0
	for i := range 300 {
		frame := fmt.Sprintf(`{"type":"response.created","i":%d}`, i)
		lost := make(chan error, 1)
		c.Watch(func(err error) { lost <- err })
		sent := make(chan error, 1)
		go func() { sent <- p.Send(context.Background(), []byte(frame)) }()
		if i%2 == 0 { // half the time the frame is on its way before Claim
			if err := wait(t, "the peer's send", sent); err != nil {
				t.Fatal(err)
			}
		}
		if c.Claim() {
			got, err := c.Next(t.Context())
			if err != nil || string(got) != frame {
				t.Fatalf("iteration %d: claimed, Next = %q, %v; want %s", i, got, err, frame)
			}
			select {
			case err := <-lost:
				t.Fatalf("iteration %d: the frame was delivered and lost(%v) called too", i, err)
			default:
			}
			toConsumer++
		} else {
			var ue *UnexpectedFrameError
			if err := wait(t, "lost", lost); !errors.As(err, &ue) || string(ue.Frame) != frame {
				t.Fatalf("iteration %d: Claim false, lost(%v); want the raced frame", i, err)
			}
			toLost++
			_ = c.CloseNow()
			c, p = dialPeer(t, srv, DialOptions{})
		}
		if i%2 == 1 {
			if err := wait(t, "the peer's send", sent); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("300 races: %d frames to the consumer, %d to the watch", toConsumer, toLost)
}

// Close sends the close frame and the reader reads the peer's answer;
// a frame the reader held is discarded on the way.
func TestCloseHandshake(t *testing.T) {
	srv := upstreamtest.NewServer(t)
	c, p := dialPeer(t, srv, DialOptions{})
	send(t, p, `{"type":"untaken"}`) // the reader holds it: Close must still read the answer
	start := time.Now()
	if err := c.Close(websocket.StatusGoingAway, "pool closed"); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(start); d >= CloseTimeout {
		t.Errorf("Close took %v with an answering peer, want under the %v bound", d, CloseTimeout)
	}
	wait(t, "the peer to see the close", p.Gone())
	var ce websocket.CloseError
	if err := p.Err(); !errors.As(err, &ce) || ce.Code != websocket.StatusGoingAway || ce.Reason != "pool closed" {
		t.Errorf("peer saw %v, want 1001 \"pool closed\"", err)
	}
	if err := c.Send(t.Context(), []byte("{}")); err == nil {
		t.Error("Send after Close succeeded; want the socket released")
	}
}

// A peer that does not answer the close frame cannot hold Close: past
// CloseTimeout (well before coder/websocket's own 5 s) the socket is
// closed hard. The close frame was still sent.
func TestCloseIsBounded(t *testing.T) {
	srv := upstreamtest.NewServer(t)
	srv.Deafen(true)
	c, p := dialPeer(t, srv, DialOptions{})
	start := time.Now()
	if err := c.Close(websocket.StatusGoingAway, "pool closed"); err != nil {
		t.Errorf("Close with a peer that never answers = %v, want nil (the socket is released either way)", err)
	}
	if d := time.Since(start); d < CloseTimeout || d > CloseTimeout+3*time.Second {
		t.Errorf("Close took %v with a peer that never answers, want about the %v bound", d, CloseTimeout)
	}
	if err := c.Send(t.Context(), []byte("{}")); err == nil {
		t.Error("Send after Close succeeded; want the socket released")
	}
	p.Listen()
	wait(t, "the peer to read", p.Gone())
	if code := websocket.CloseStatus(p.Err()); code != websocket.StatusGoingAway {
		t.Errorf("peer read %v, want the 1001 close frame", p.Err())
	}
}

// CloseNow releases the socket at once, also in the middle of a Close
// waiting for a silent peer.
func TestCloseNow(t *testing.T) {
	srv := upstreamtest.NewServer(t)
	c, p := dialPeer(t, srv, DialOptions{})
	if err := c.CloseNow(); err != nil {
		t.Fatalf("CloseNow: %v", err)
	}
	wait(t, "the peer to see the client go", p.Gone())
	if code := websocket.CloseStatus(p.Err()); code != -1 {
		t.Errorf("peer saw close %v, want no close frame", code)
	}
	if _, ok := <-c.Frames(); ok {
		t.Error("Frames open after CloseNow")
	}

	srv.Deafen(true)
	c, _ = dialPeer(t, srv, DialOptions{})
	closed := make(chan error, 1)
	go func() { closed <- c.Close(websocket.StatusGoingAway, "pool closed") }() // either order must work
	start := time.Now()
	if err := c.CloseNow(); err != nil {
		t.Errorf("CloseNow during Close: %v", err)
	}
	if err := wait(t, "Close to return", closed); err != nil {
		t.Errorf("Close cut short by CloseNow: %v", err)
	}
	if d := time.Since(start); d > CloseTimeout/2 {
		t.Errorf("Close returned %v after CloseNow, want at once", d)
	}
}
